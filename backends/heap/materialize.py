"""A heap job's new base written by a forked child, while the replica goes on (Flink's periodic
materialization of a changelog, done the way Redis's BGSAVE is).

The fork's memory is the state as it was at the fork: the child writes it whole, on another core,
sharing neither the GIL nor Python's copy on write with the replica, then exits. The kernel copies
the pages either side touches meanwhile, which with CPython's reference counts is most of the
state: a child is forked only where memory leaves room for a second copy
(:func:`~statehouse.backends.memory.room_for_a_copy`). The child writes a local file; the parent
uploads it. Nothing the child does unwinds into the parent's frames: it leaves by ``os._exit``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn

from statehouse.backends.base.partition import FrozenView
from statehouse.backends.snapshot.full_format import write_key_groups
from statehouse.snapshots.compression import Codec
from statehouse.snapshots.full_format import SnapshotHeader
from statehouse.snapshots.handles import KeyGroupsHandle
from statehouse.snapshots.storage.local import LocalStorage

log = logging.getLogger(__name__)

SCRATCH_PREFIX = "statehouse-base-"  # a writer's local directory (one a killed replica left: removed at start)
_HANDLE = "handle.json"  # the written stream's handle, as the child leaves it in its scratch directory
_ERROR = "error.txt"  # why the child failed, for the parent's error
_POLL_S = 0.02


def fork_writer(view: FrozenView, header: SnapshotHeader, codec: Codec, now_ms: int, scratch: str, path: str) -> int:
    """Fork a child that writes the key groups of ``header`` whole from ``view`` to ``path`` under
    the local directory ``scratch``; the child's pid. Call it with the job's writes held off (the
    fork is the snapshot); the child takes no lock the parent's other threads may hold."""
    pid = os.fork()
    if pid == 0:
        _write_and_exit(view, header, codec, now_ms, scratch, path)
    return pid


def _write_and_exit(
    view: FrozenView, header: SnapshotHeader, codec: Codec, now_ms: int, scratch: str, path: str
) -> NoReturn:
    code = 1
    try:
        with LocalStorage(scratch).create_output(path) as out:
            written = write_key_groups(view, out, header, codec, now_ms)
        Path(scratch, _HANDLE).write_text(json.dumps(written.to_dict()))
        code = 0
    except BaseException:
        Path(scratch, _ERROR).write_text(traceback.format_exc(limit=-3))
    finally:
        os._exit(code)


def wait_for(pid: int, scratch: str, cancel: threading.Event, timeout_s: float) -> KeyGroupsHandle:
    """The handle of what the child ``pid`` wrote, once it has exited; it is killed when
    ``cancel`` is set or after ``timeout_s`` (then ``InterruptedError`` or ``TimeoutError``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if cancel.is_set() or time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            if cancel.is_set():
                raise InterruptedError("the base's writer was stopped")
            raise TimeoutError(f"the base's writer did not finish within {timeout_s:.0f} s")
        cancel.wait(_POLL_S)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        error = Path(scratch, _ERROR)
        why = error.read_text().strip().splitlines()[-1] if error.exists() else f"exit status {code}"
        raise RuntimeError(f"the base's writer failed: {why}")
    return KeyGroupsHandle.from_dict(json.loads(Path(scratch, _HANDLE).read_text()))
