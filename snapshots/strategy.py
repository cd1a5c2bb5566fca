"""The snapshot strategy protocol: a short synchronous part, then an asynchronous part (Flink's
``SnapshotStrategy``).

A backend's store advertises which strategy takes a checkpoint or a savepoint of its jobs
(:meth:`~statehouse.backends.base.store.Store.snapshot_strategy`), as a Flink state
backend owns its strategies. :meth:`SnapshotStrategy.prepare` runs while the job's writes
are held off and only freezes the state (heap copy-on-write, a RocksDB native checkpoint);
the :class:`AsyncSnapshot` it returns runs on a background thread, writes the files and
releases the frozen view. The runner (:mod:`statehouse.backends.checkpointing.runner`) does the threading,
:mod:`statehouse.backends.checkpointing.manager` the lifecycle.

Only the protocol is here, below the backends: the strategies themselves are the backends'
(the canonical full one in ``statehouse.backends.snapshot.full_strategy``, RocksDB's
incremental one in ``statehouse.backends.rocksdb.snapshot``), so the protocol is generic in
the job type it freezes.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.compression import Codec
from statehouse.snapshots.handles import ChangelogChain, KeyedHandle, StreamHandle
from statehouse.snapshots.layout import SnapshotKind
from statehouse.snapshots.metadata import SnapshotFormat, SnapshotPart
from statehouse.snapshots.storage.base import CheckpointStorage

JobT = TypeVar("JobT", contravariant=True)


class Frozen(Protocol):
    """A frozen view of a job's state, held until the asynchronous part has written it."""

    def release(self) -> None: ...


@dataclass(frozen=True)
class Seed:
    """Shared files uploaded ahead of a checkpoint (a live rescale's load, once its copy is
    loaded), by file name, root-relative: that checkpoint reuses what still holds, as it reuses a
    previous checkpoint's. RocksDB's: the table files of a joining replica's database. The heap's:
    a base of the key groups the copy loaded (``chains``, root-relative), the partition's change
    log cut as it was written (``cut``), which the first checkpoint holding them builds on."""

    backend_uid: str
    files: dict[str, StreamHandle]
    chains: tuple[ChangelogChain, ...] = ()
    cut: tuple[int, int] | None = None

    def key_groups(self) -> list[KeyGroupRange]:
        """The key groups a heap seed holds (none for a RocksDB one: it holds files)."""
        return [chain.key_group_range for chain in self.chains]


@dataclass(frozen=True)
class SeedContext:
    """Where and what a :class:`Seed` is written: the job's name in ``storage``, this replica's
    last completed checkpoint of it, the key groups (a live rescale's copy loaded, or all of the
    job's for a materialization), the codec; a materialization's stop and its local scratch
    directory's parent (None: the system's)."""

    storage: CheckpointStorage
    name: str
    previous: SnapshotPart | None
    key_groups: Sequence[KeyGroupRange]
    codec: Codec
    cancel: threading.Event = field(default_factory=threading.Event)
    scratch: str | None = None


@dataclass
class SnapshotContext:
    """Where and how one replica part of one checkpoint is written."""

    storage: CheckpointStorage
    job: str
    checkpoint_id: int
    kind: SnapshotKind
    directory: str  # the snapshot directory (holds _metadata), root-relative
    part: str  # this replica's sub-directory name
    codec: Codec
    previous: SnapshotPart | None = None  # this replica's last completed checkpoint of the job
    seed: Seed | None = None  # files uploaded ahead of this replica's first checkpoint of the job
    cancel: threading.Event = field(default_factory=threading.Event)
    written: list[str] = field(default_factory=list)  # root-relative paths, for cleanup on failure

    def part_path(self, name: str) -> str:
        return f"{self.directory}/{self.part}/{name}"

    def check_cancelled(self) -> None:
        if self.cancel.is_set():
            raise InterruptedError(f"checkpoint {self.checkpoint_id} was aborted")


@dataclass(frozen=True)
class SnapshotResult:
    """What an asynchronous part produced; handle paths relative to the snapshot directory."""

    format: SnapshotFormat
    keyed: KeyedHandle
    operator: StreamHandle
    states: list[dict[str, Any]]
    max_parallelism: int
    bytes_uploaded: int
    bytes_reused: int
    committed_epoch: int = 0  # the last task-attempt epoch committed into the frozen state (the runner's)
    committed_batch: int | None = None  # the micro-batch that epoch applied (the runner's)


class AsyncSnapshot:
    """The asynchronous part: call once on a background thread. Always releases the view."""

    def __init__(self, view: Frozen, body: Callable[[], SnapshotResult]) -> None:
        self._view = view
        self._body = body

    def run(self) -> SnapshotResult:
        try:
            return self._body()
        finally:
            self._view.release()


class SnapshotStrategy(ABC, Generic[JobT]):
    """Flink's ``SnapshotStrategy``: how one backend writes a replica's part of a snapshot, in a
    synchronous part under the job's lock (:meth:`prepare`) and an asynchronous upload it returns;
    :meth:`settle` and :meth:`seed` are work done beforehand, off the snapshot's path."""

    format: SnapshotFormat

    def settle(self, job: JobT) -> None:
        """Before the synchronous part, while the job's writes go on: slow work that makes the
        snapshot cheaper to take or to read."""

    # Whether a replica that stays through a move seeds the key groups it takes (else only a
    # joining replica seeds, its whole database).
    seeds_taken_key_groups: bool = False

    def seed(self, job: JobT, ctx: SeedContext) -> Seed | None:
        """Upload now what the next checkpoint of ``job`` would upload as shared files, and that
        ``ctx.previous`` does not hold; None where a strategy shares none."""
        return None

    def materialization_due(self, previous: SnapshotPart) -> bool:
        """Whether a new base of the job, written in the background after its checkpoint
        ``previous`` (:meth:`materialize`), would spare a later checkpoint writing one inline;
        never, by default."""
        return False

    def materialize(self, job: JobT, ctx: SeedContext) -> Seed | None:
        """A seed of all of the job's key groups written in the background while writes go on
        (Flink's periodic materialization of a changelog); None where the strategy has none, or
        cannot write one now."""
        return None

    def unseed(self, job: JobT, seed: Seed) -> None:
        """``seed`` will not be used (its move aborted): let go of what the backend keeps for it
        (its files are deleted by the caller). Nothing by default."""

    @abstractmethod
    def prepare(self, job: JobT, ctx: SnapshotContext) -> AsyncSnapshot:
        """The synchronous part, with the job's writes held off: freeze, capture meta info,
        return the asynchronous part."""
