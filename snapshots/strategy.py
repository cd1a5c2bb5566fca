"""Snapshot strategies: a short synchronous part, then an asynchronous part (Flink's
``SnapshotStrategy``).

A backend's store advertises which strategy takes a checkpoint or a savepoint of its jobs
(:meth:`~statehouse.backends.base.store.Store.snapshot_strategy`), as a Flink state
backend owns its strategies. :meth:`SnapshotStrategy.prepare` runs while the job's writes
are held off and only freezes the state (heap copy-on-write, a RocksDB native checkpoint);
the :class:`AsyncSnapshot` it returns runs on a background thread, writes the files and
releases the frozen view. The runner (:mod:`statehouse.snapshots.runner`) does the threading,
:mod:`statehouse.snapshots.manager` the lifecycle.

:class:`FullSnapshotStrategy` writes the canonical format from any backend's frozen view: heap
checkpoints, RocksDB full checkpoints, and every savepoint. RocksDB's incremental strategy is
in ``statehouse.backends.rocksdb.snapshot``.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from statehouse.backends.base.partition import FrozenView
from statehouse.backends.job import Job
from statehouse.backends.reserved import keyed_tables
from statehouse.snapshots.compression import Codec
from statehouse.snapshots.full_format import SnapshotHeader, write_key_groups
from statehouse.snapshots.handles import KeyedHandle, StreamHandle
from statehouse.snapshots.layout import SnapshotKind
from statehouse.snapshots.metadata import SnapshotFormat, SnapshotPart
from statehouse.snapshots.operator_format import OperatorSnapshot
from statehouse.snapshots.storage.base import CheckpointStorage


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
    cancel: threading.Event = field(default_factory=threading.Event)
    written: list[str] = field(default_factory=list)  # root-relative paths, for cleanup on failure

    def part_path(self, name: str) -> str:
        return f"{self.directory}/{self.part}/{name}"

    def check_cancelled(self) -> None:
        if self.cancel.is_set():
            raise InterruptedError(f"checkpoint {self.checkpoint_id} was aborted")

    def write_operator_state(self, view: FrozenView) -> StreamHandle:
        """The operator-state file of this part (the same for every strategy); root-relative."""
        with self.storage.create_output(self.part_path("operator.bin")) as out:
            out.write(OperatorSnapshot.from_view(view).to_bytes())
            handle = out.close_and_get_handle()
        self.written.append(handle.path)
        return handle


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


class AsyncSnapshot:
    """The asynchronous part: call once on a background thread. Always releases the view."""

    def __init__(self, view: FrozenView, body: Callable[[], SnapshotResult]) -> None:
        self._view = view
        self._body = body

    def run(self) -> SnapshotResult:
        try:
            return self._body()
        finally:
            self._view.release()


class SnapshotStrategy(ABC):
    format: SnapshotFormat

    @abstractmethod
    def prepare(self, job: Job, ctx: SnapshotContext) -> AsyncSnapshot:
        """The synchronous part, with the job's writes held off: freeze, capture meta info,
        return the asynchronous part."""


def descriptor_dicts(job: Job) -> list[dict[str, Any]]:
    """The job's keyed-state descriptors as a snapshot stores them (sorted by name)."""
    return [job.descriptors[name].to_dict() for name in sorted(job.descriptors)]


class FullSnapshotStrategy(SnapshotStrategy):
    """The canonical format: every key group of the replica's range, from any backend's view."""

    format: SnapshotFormat = "full"

    def prepare(self, job: Job, ctx: SnapshotContext) -> AsyncSnapshot:
        view = job.partition.freeze()
        states = descriptor_dicts(job)
        header = SnapshotHeader(job.name, job.max_parallelism, job.key_group_range, keyed_tables(view.tables()), states)
        now_ms = job.clock.now_ms()  # TTL cleanup judges expiry as of the freeze

        def body() -> SnapshotResult:
            with ctx.storage.create_output(ctx.part_path("keyed.bin")) as out:
                keyed = write_key_groups(view, out, header, ctx.codec, now_ms, ctx.cancel.is_set)
            ctx.written.append(keyed.stream.path)
            ctx.check_cancelled()
            operator = ctx.write_operator_state(view)
            uploaded = keyed.stream.size + operator.size
            keyed = type(keyed)(keyed.stream.relative_to(ctx.directory), keyed.header, keyed.offsets)
            return SnapshotResult(
                "full", keyed, operator.relative_to(ctx.directory), states, job.max_parallelism, uploaded, 0
            )

        return AsyncSnapshot(view, body)


FULL = FullSnapshotStrategy()
