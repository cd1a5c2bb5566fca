"""Degrade on a full volume: a job's database that RocksDB failed for lack of space serves
reads and refuses writes until it is reopened for writing (``space.py`` says why)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from statehouse.backends.errors import InsufficientStorage
from statehouse.backends.rocksdb.space import DataVolume, Degradable, is_out_of_space

_T = TypeVar("_T")


class DegradePolicy:
    """Whether one job's database is degraded, and the rules that make and clear it.

    A write is refused (507) while the database is degraded, or while the volume is below its
    reserve; a write or an open that RocksDB fails for lack of space degrades it. A write
    RocksDB refused was not applied (a write batch is atomic), and a stopped database keeps
    every write it acknowledged in its write-ahead log: the reopen for writing, which the
    database instance does (``DatabaseInstance.recover``), replays it. A degraded instance is
    registered with the volume, whose periodic check asks it to recover."""

    def __init__(self, volume: DataVolume | None) -> None:
        self.volume = volume  # None: no reserve (staged restores, snapshot readers)
        self.degraded = False  # failed for lack of space, or open read-only: no writes until reopened

    def require_writable(self, reserve: bool) -> None:
        """Refuse a write (507) while degraded, or (``reserve``) while the volume is below its reserve."""
        if self.degraded:
            raise InsufficientStorage(
                "the data volume ran out of space: this job serves reads but takes no writes until space is "
                "freed (it is reopened for writing by itself)"
            )
        if reserve and self.volume is not None:
            self.volume.require()

    def degrade(self, instance: Degradable) -> None:
        """``instance`` failed for lack of space, or opened read-only: it waits to recover."""
        self.degraded = True
        if self.volume is not None:
            self.volume.degraded(instance)

    def clear(self, instance: Degradable) -> None:
        """``instance`` closed: its next open tries for writing again."""
        if self.degraded:
            self.degraded = False
            if self.volume is not None:
                self.volume.restored(instance)

    def room_to_reopen(self) -> bool:
        """Whether the volume has the room for a reopen for writing (no volume: always)."""
        return self.volume is None or self.volume.room_to_reopen()

    def writing(self, instance: Degradable, write: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run ``write(*args, **kwargs)``; if RocksDB fails it for lack of space, degrade ``instance``
        and refuse (507)."""
        try:
            return write(*args, **kwargs)
        except Exception as exc:
            if not is_out_of_space(exc):
                raise
            self.degrade(instance)
            raise InsufficientStorage(
                f"the data volume is full ({exc}); the write was not applied, and the job takes writes "
                "again once space is freed"
            ) from exc
