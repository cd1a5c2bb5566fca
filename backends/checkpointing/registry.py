"""The shared-state registry: when a shared (incremental) file may be deleted.

Flink ≥ 1.15 semantics (``SharedStateRegistryImpl``), not a reference count: every entry
remembers the checkpoint that ``created`` it and the newest one that ``last_used`` it;
after a checkpoint completes, the entries with ``last_used`` below the lowest retained
checkpoint id are no longer reachable from any retained checkpoint and their files go.

The registry is in memory; after a restart it is rebuilt by registering the shared files
of the retained checkpoints' metadata in id order, which yields the same entries.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from statehouse.snapshots.handles import StreamHandle


@dataclass
class SharedEntry:
    handle: StreamHandle
    created: int
    last_used: int


class SharedStateRegistry:
    """Flink's ``SharedStateRegistry``: the shared files of a job's incremental checkpoints, each
    with the first and newest checkpoint that use it, so the files no retained checkpoint uses can
    be deleted once a checkpoint completes."""

    def __init__(self) -> None:
        self._entries: dict[str, SharedEntry] = {}
        self._lock = threading.Lock()

    def register_reference(
        self, key: str, handle: StreamHandle, checkpoint_id: int, *, placeholder: bool = False
    ) -> StreamHandle:
        """Record that ``checkpoint_id`` uses the file ``key``; returns the registered handle.

        A placeholder (a file the checkpoint reuses without uploading) must already be known.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                if placeholder:
                    raise KeyError(f"placeholder for unknown shared file {key!r}")
                self._entries[key] = SharedEntry(handle, checkpoint_id, checkpoint_id)
                return handle
            entry.last_used = max(entry.last_used, checkpoint_id)
            return entry.handle

    def unregister_unused(self, lowest_retained: int) -> list[StreamHandle]:
        """Drop entries no retained checkpoint can use; returns the files to delete."""
        with self._lock:
            unused = [k for k, e in self._entries.items() if e.last_used < lowest_retained]
            return [self._entries.pop(k).handle for k in unused]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def entries(self) -> dict[str, SharedEntry]:
        with self._lock:
            return {k: SharedEntry(e.handle, e.created, e.last_used) for k, e in self._entries.items()}
