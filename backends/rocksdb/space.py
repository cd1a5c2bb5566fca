"""The data volume's free space, against a reserve kept for RocksDB itself.

Left alone, a full volume makes every write fail, leaves a job unwritable after space comes
back (RocksDB stops writing after a failed write and stays so until it is reopened), and, after
a restart, a job that cannot even be opened (replaying its write-ahead log writes its
memtables out first). So:

* writes are refused with 507 ``insufficient_storage`` while the free space is below the
  reserve, before RocksDB runs out: what is left lets every job reopen (replaying a write-ahead
  log bounded by :func:`wal_limit`), flush and compact;
* a job whose database failed for lack of space, or could only be opened read-only, is
  *degraded*: it serves reads, refuses writes with 507, and is reopened for writing once the
  volume is above the reserve again (:meth:`DataVolume.recover`, run periodically, or its next
  use);
* :attr:`DataVolume.ready` is what ``/readyz`` reports.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Protocol

from statehouse.backends.errors import InsufficientStorage

logger = logging.getLogger(__name__)

# The write-ahead log of one job is kept below this share of the reserve (and 64 MiB): reopening
# a job replays it into new table files, which must fit in what the reserve keeps free.
_WAL_SHARE_OF_RESERVE = 4
_WAL_LIMIT_MAX = 64 << 20
_WAL_LIMIT_MIN = 1 << 20


def is_out_of_space(exc: BaseException) -> bool:
    """Whether a RocksDB (or OS) error says the volume is full."""
    if isinstance(exc, OSError):
        return exc.errno in (28, 122)  # ENOSPC, EDQUOT
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text or "NoSpace" in text


def wal_limit(reserve_bytes: int) -> int:
    """RocksDB's ``max_total_wal_size`` for a job, so that replaying its log fits in the reserve."""
    return max(_WAL_LIMIT_MIN, min(_WAL_LIMIT_MAX, reserve_bytes // _WAL_SHARE_OF_RESERVE))


class Degradable(Protocol):
    def recover(self) -> bool: ...


class DataVolume:
    """The volume of ``path``: free bytes (``statvfs``) against ``reserve_bytes``."""

    def __init__(self, path: str, reserve_bytes: int) -> None:
        if reserve_bytes < 0:
            raise ValueError(f"reserve_bytes must be >= 0, got {reserve_bytes}")
        self.path = path
        self.reserve_bytes = reserve_bytes
        self._lock = threading.Lock()
        self._degraded: set[Degradable] = set()
        self._low = False
        self.above_reserve()  # readiness is right from the start

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def require(self, what: str = "this write") -> None:
        """Refuse ``what`` (507) while the free space is below the reserve.

        One ``statvfs`` (1-2 µs measured) per write request: a reading taken even a moment
        earlier could let a burst of large writes run through the reserve."""
        free = self.free_bytes()
        if self._read(free):
            raise InsufficientStorage(
                f"the data volume has {free:,} bytes free, below the reserve of {self.reserve_bytes:,} "
                f"(STATEHOUSE_DISK_RESERVE_BYTES) kept so that the state can always be reopened and read; "
                f"{what} is refused until space is freed or the volume grown (writes resume by themselves)",
                free_bytes=free,
                reserve_bytes=self.reserve_bytes,
            )

    def above_reserve(self) -> bool:
        """Read the free space now: whether it is at least the reserve."""
        return not self._read(self.free_bytes())

    def room_to_reopen(self) -> bool:
        """Read the free space now: whether a degraded job may be reopened for writing — the
        reserve plus a write-ahead log's replay free (else each try would fail again, and cost)."""
        free = self.free_bytes()
        self._read(free)
        return free >= self.reserve_bytes + wal_limit(self.reserve_bytes)

    def _read(self, free: int) -> bool:
        """Record a reading of ``free`` bytes: whether it is below the reserve. A crossing is
        logged once, either way (the writes refused meanwhile are each one's 507, not a line)."""
        low = free < self.reserve_bytes
        if low != self._low:
            if low:
                logger.warning(
                    "data volume %s: %s bytes free, below the reserve of %s (STATEHOUSE_DISK_RESERVE_BYTES): "
                    "writes are refused until space is freed",
                    self.path,
                    f"{free:,}",
                    f"{self.reserve_bytes:,}",
                )
            else:
                logger.info(
                    "data volume %s: %s bytes free, above the reserve again: writes resume", self.path, f"{free:,}"
                )
        self._low = low
        return low

    # -- degraded jobs ------------------------------------------------------------------------

    def degraded(self, instance: Degradable) -> None:
        """``instance`` failed for lack of space (or opened read-only): it waits for :meth:`recover`."""
        with self._lock:
            self._degraded.add(instance)

    def restored(self, instance: Degradable) -> None:
        with self._lock:
            self._degraded.discard(instance)

    @property
    def degraded_count(self) -> int:
        return len(self._degraded)

    def recover(self) -> bool:
        """Read the free space; if above the reserve, reopen the degraded jobs for writing.
        Whether the volume takes writes now (what readiness reports)."""
        if self.room_to_reopen():
            with self._lock:
                waiting = list(self._degraded)
            for instance in waiting:
                instance.recover()  # removes itself when it is writable again
        return self.ready

    @property
    def ready(self) -> bool:
        """The volume was above the reserve at the last reading, and no job waits to recover."""
        return not self._low and not self._degraded

    def not_ready_reason(self) -> str:
        if self._low:
            return (
                f"the data volume ({self.path}) is below its reserve of {self.reserve_bytes:,} bytes "
                "(STATEHOUSE_DISK_RESERVE_BYTES): writes are refused until space is freed"
            )
        return f"{len(self._degraded)} job(s) ran out of space and wait to be reopened for writing"
