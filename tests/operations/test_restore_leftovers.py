"""A restore SIGKILLed mid-way leaves its staging copy of the snapshot in
``$STATEHOUSE_DATA_DIR/$restore/statehouse-restore-*`` (and a heap's forked base writer its
``statehouse-base-*``); the next start removes them (and nothing else there), and the job is as
it was before the restore."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.checkpoint_status import wait_status
from tests.support.server import start_server

pytestmark = [pytest.mark.http, pytest.mark.slow]  # servers killed mid-restore

KEYS = 400
VALUE_BYTES = 20_000  # ~8 MB of incompressible values: the restore downloads them for a while


def _staging(work: Path) -> list[str]:
    try:
        return [n for n in os.listdir(work) if n.startswith("statehouse-restore-")]
    except FileNotFoundError:
        return []


def _fill(http: httpx.Client, job: str) -> dict[str, str]:
    written: dict[str, str] = {}
    for start in range(0, KEYS, 50):
        ops = []
        for i in range(start, start + 50):
            written[f"k{i}"] = os.urandom(VALUE_BYTES // 2).hex()
            ops.append({"op": "put", "state": "v", "key": f"k{i}", "value": written[f"k{i}"]})
        assert http.post(f"{job}/batch", json={"ops": ops}).status_code == 200
    return written


@pytest.mark.parametrize("backend", ["rocksdb", "heap"])
def test_a_restore_killed_midway_leaves_nothing_after_a_restart(tmp_path, backend):
    env = {"STATEHOUSE_BACKEND": backend, "STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    work = tmp_path / "data" / "$restore"
    server = start_server(tmp_path, env)
    try:
        http = httpx.Client(base_url=server.url + "/v1", timeout=60)
        job = "/jobs/j"
        http.put(job, json={"max_parallelism": 128}).raise_for_status()
        http.put(f"{job}/states/v", json={"kind": "value"}).raise_for_status()
        written = _fill(http, job)
        assert http.post(f"{job}/checkpoints", json={"checkpoint_id": 1}).status_code == 202
        assert wait_status(http, job, 1, timeout=60)["status"] == "uploaded"
        http.post(f"{job}/checkpoints/1/complete").raise_for_status()
        # something beside the staging copies that the cleanup must leave alone
        (work / "operator-notes").write_text("not the service's")
        # The real kill: SIGKILL as soon as the restore's staging directory exists. A restore
        # that finishes before it is seen is retried (the state stays the checkpoint's).
        for _attempt in range(20):
            restore = threading.Thread(target=lambda: _post_quietly(http, f"{job}/restore"))
            restore.start()
            while restore.is_alive() and not _staging(work):
                time.sleep(0.0005)
            if _staging(work):
                server.process.send_signal(signal.SIGKILL)
                server.process.wait(10)
                restore.join(60)
                break
            restore.join()
        else:
            pytest.fail("never saw a restore's staging directory: the restore is too fast to kill mid-way")
        assert _staging(work), "the killed restore left no staging copy: nothing to test"
        (work / "statehouse-base-k1ll3d").mkdir()  # as a heap's forked base writer killed with it leaves
        server = start_server(tmp_path, env, port=int(server.url.rsplit(":", 1)[1]))
        http = httpx.Client(base_url=server.url + "/v1", timeout=60)
        assert _staging(work) == []
        assert (work / "operator-notes").read_text() == "not the service's"
        assert not (work / "statehouse-base-k1ll3d").exists()
        assert "removed 2 staging copies (restores', base writers')" in server.log()
        if backend == "heap":  # the heap backend's state went with the process: restore it
            http.post(f"{job}/restore", json={"checkpoint_id": 1}).raise_for_status()
        reads = [{"op": "get", "state": "v", "key": k} for k in written]
        got = http.post(f"{job}/batch", json={"ops": reads}).json()["results"]
        assert [r["value"] for r in got] == list(written.values())
    finally:
        server.stop()


def _post_quietly(http: httpx.Client, path: str) -> None:
    with contextlib.suppress(httpx.TransportError):  # the server was killed under it
        http.post(path, json={"checkpoint_id": 1})
