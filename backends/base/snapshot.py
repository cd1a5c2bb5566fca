"""What a backend's snapshot strategies and restore readers work with, as interfaces: the few
things of a job a strategy reads (:class:`SnapshotSource`, which ``Job`` satisfies as it is), and
how one snapshot format's part is read back (:class:`PartReader`, :class:`FetchedPart`).

They sit here so that the strategies and readers (``statehouse.backends.snapshot``,
``statehouse.backends.rocksdb.snapshot``) need nothing above them: the job and the checkpoint
coordinator import these, never the other way round (Flink: a backend's snapshot strategy and
restore operation see the backend's state, not the task that owns it).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Protocol

from statehouse.backends.base.partition import Guard, StorePartition
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.metadata import SnapshotPart
from statehouse.snapshots.storage.base import CheckpointStorage
from statehouse.snapshots.stored.descriptors import StateDescriptor


class Clock(Protocol):
    """Milliseconds as the job's TTL judges them."""

    def now_ms(self) -> int: ...


class FrozenKeyGroups(Protocol):
    """The key groups a live rescale froze on this replica (they move out; none: empty)."""

    @property
    def frozen(self) -> tuple[KeyGroupRange, ...]: ...


class SnapshotSource(Protocol):
    """What a snapshot strategy reads of a job: its identity and range, its keyed-state
    descriptors, its partition (frozen in the synchronous part), the clock TTL cleanup judges
    expiry by, and the key groups a live rescale froze."""

    @property
    def name(self) -> str: ...

    @property
    def max_parallelism(self) -> int: ...

    @property
    def key_group_range(self) -> KeyGroupRange: ...

    @property
    def partition(self) -> StorePartition: ...

    @property
    def descriptors(self) -> Mapping[str, StateDescriptor]: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def keyspace(self) -> FrozenKeyGroups: ...

    def exclusive(self) -> AbstractContextManager[None]:
        """The job's writes held off (what a snapshot's synchronous part runs under)."""
        ...


class FetchedPart(Protocol):
    """Some key groups of one snapshot part, fetched from storage and verified, ready to load."""

    def tables(self) -> dict[str, bool]:
        """The keyed tables (name -> nested) the part holds records of."""
        ...

    def load_into(self, partition: StorePartition, guard: Guard) -> int:
        """Write the fetched key groups' entries into ``partition``, where those key groups hold
        nothing, each change to it inside ``guard()`` (a live job's lock); how many entries.
        A format the partition stores as it is may hand it over whole instead of write by write."""
        ...

    def release(self) -> None:
        """Drop what the fetch holds (local files, buffers); nothing is loaded from it after."""
        ...


class PartReader(Protocol):
    """How parts of one snapshot format are read back (a Flink backend's restore operation for
    one kind of handle): which fetches a load of some key groups makes, and each fetch."""

    def chunks(self, part: SnapshotPart, wanted: KeyGroupRange, max_bytes: int) -> list[KeyGroupRange]:
        """``wanted`` (within the part's range) cut into ranges a fetch of which holds at most
        about ``max_bytes`` in memory (one key group larger than that is a range alone)."""
        ...

    def fetch(
        self, storage: CheckpointStorage, part: SnapshotPart, wanted: KeyGroupRange, work_dir: str
    ) -> FetchedPart:
        """Fetch and verify the ``wanted`` key groups of ``part``; local files go under
        ``work_dir`` (which the caller removes in the end)."""
        ...
