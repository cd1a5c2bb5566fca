"""A bound on the RocksDB instances (one per job) a replica keeps open.

Each open instance costs file descriptors (its WAL, MANIFEST, LOG, LOCK, one per column
family, up to ``MAX_OPEN_FILES`` table files) and memory (memtables, caches). With thousands
of jobs all open a replica would run out of descriptors and every request fail; so at most
``capacity`` stay open, and when one more opens, the least recently used idle ones close. A
closed one reopens on its next access (about 10 ms). An instance in use — a request, an
iterator, a checkpoint's freeze — holds a lease and is never closed, so the bound can be
exceeded for as long as more instances than that are busy at once.

Why not one shared RocksDB per replica with a column family per job and state (measured with
300 jobs): a shared instance takes 24 ms per new column family, growing (RocksDB rewrites and
re-verifies its whole OPTIONS file on every one), and still holds one descriptor per column
family, while an instance per job opens in ~10 ms, closes in ~1 ms and keeps per-job
checkpoints and restores (SST files, directory swaps) as they are. Point reads cost the same
either way (0.6-0.7 µs).
"""

from __future__ import annotations

import threading
from typing import Protocol


class Instance(Protocol):
    last_used: int

    def close_idle(self) -> bool: ...


class OpenInstances:
    """The set of RocksDB instances open on a replica, bounded by ``capacity`` (``None``: no bound):
    past it, the least recently used idle instances close, so file descriptors stay bounded
    however many jobs a replica holds; an instance in use is never closed."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._open: set[Instance] = set()

    def __len__(self) -> int:
        return len(self._open)

    def add(self, instance: Instance) -> None:
        """An instance opened (call :meth:`trim` after, without holding its lock)."""
        with self._lock:
            self._open.add(instance)

    def discard(self, instance: Instance) -> None:
        """An instance closed."""
        with self._lock:
            self._open.discard(instance)

    def trim(self) -> None:
        """Close the least recently used idle instances until no more than ``capacity`` are open.

        Takes each instance's own lock (in ``close_idle``) without holding the pool's: an
        instance's lock is always taken before the pool's, never after.
        """
        if self.capacity is None or len(self._open) <= self.capacity:
            return
        with self._lock:
            candidates = sorted(self._open, key=lambda i: i.last_used)
        excess = len(candidates) - self.capacity
        for instance in candidates:
            if excess <= 0:
                return
            if instance.close_idle():
                excess -= 1
