"""Snapshot strategies: a short synchronous part, then an asynchronous upload.

Flink's ``SnapshotStrategy``: :meth:`SnapshotStrategy.prepare` runs on the job's writer
thread and only freezes the state (heap copy-on-write, RocksDB native checkpoint); the
:class:`AsyncSnapshot` it returns runs on a background thread, writes the files and
releases the frozen view. Strategies know nothing about HTTP or lifecycle: the
:class:`~snapshots.manager.CheckpointManager` is the runner.

* :class:`FullSnapshotStrategy` — the canonical format (heap checkpoints, RocksDB full
  checkpoints, every savepoint).
* :class:`IncrementalSnapshotStrategy` — RocksDB only: uploads the SST files the last
  completed checkpoint did not have, references the others.
"""

from __future__ import annotations

import os
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from statehouse.backends.base.partition import FrozenView
from statehouse.backends.job import Job
from statehouse.backends.rocksdb.partition import RocksDBPartition
from statehouse.snapshots.compression import Codec
from statehouse.snapshots.full_format import SnapshotHeader, keyed_tables, write_key_groups
from statehouse.snapshots.handles import IncrementalHandle, KeyedHandle, StreamHandle
from statehouse.snapshots.layout import SnapshotKind, shared_dir
from statehouse.snapshots.metadata import SnapshotFormat
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
    states: list[dict]
    max_parallelism: int
    bytes_uploaded: int
    bytes_reused: int


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

    def release(self) -> None:
        """Drop the frozen view without running (the attempt was abandoned)."""
        self._view.release()


class SnapshotStrategy(ABC):
    format: SnapshotFormat

    @abstractmethod
    def prepare(self, job: Job, ctx: SnapshotContext) -> AsyncSnapshot:
        """The synchronous part, on the writer thread: freeze, capture meta info, return the async part."""


def _write_operator_state(view: FrozenView, ctx: SnapshotContext) -> StreamHandle:
    with ctx.storage.create_output(ctx.part_path("operator.bin")) as out:
        out.write(OperatorSnapshot.from_view(view).to_bytes())
        handle = out.close_and_get_handle()
    ctx.written.append(handle.path)
    return handle


def _states(job: Job) -> list[dict]:
    return [job.descriptors[name].to_dict() for name in sorted(job.descriptors)]


class FullSnapshotStrategy(SnapshotStrategy):
    format: SnapshotFormat = "full"

    def prepare(self, job: Job, ctx: SnapshotContext) -> AsyncSnapshot:
        view = job.partition.freeze()
        states = _states(job)
        header = SnapshotHeader(job.name, job.max_parallelism, job.key_group_range, keyed_tables(view.tables()), states)
        now_ms = job.clock.now_ms()  # TTL cleanup judges expiry as of the freeze

        def body() -> SnapshotResult:
            with ctx.storage.create_output(ctx.part_path("keyed.bin")) as out:
                keyed = write_key_groups(view, out, header, ctx.codec, now_ms, ctx.cancel.is_set)
            ctx.written.append(keyed.stream.path)
            ctx.check_cancelled()
            operator = _write_operator_state(view, ctx)
            uploaded = keyed.stream.size + operator.size
            keyed = type(keyed)(keyed.stream.relative_to(ctx.directory), keyed.header, keyed.offsets)
            return SnapshotResult(
                "full", keyed, operator.relative_to(ctx.directory), states, job.max_parallelism, uploaded, 0
            )

        return AsyncSnapshot(view, body)


class UploadedSstFiles:
    """Flink's ``uploadedSstFiles`` bookkeeping: the SSTs of each checkpoint, by local name.

    Only the files of the last *confirmed* (completed) checkpoint are reused: they are
    durable and registered, and retention never deletes the latest checkpoint.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_checkpoint: dict[int, tuple[str, dict[str, StreamHandle]]] = {}
        self.last_completed = 0

    def reusable(self, backend_uid: str) -> dict[str, StreamHandle]:
        with self._lock:
            uid, files = self._by_checkpoint.get(self.last_completed, ("", {}))
            return dict(files) if uid == backend_uid else {}

    def add(self, checkpoint_id: int, backend_uid: str, files: dict[str, StreamHandle]) -> None:
        with self._lock:
            self._by_checkpoint[checkpoint_id] = (backend_uid, dict(files))

    def confirm(self, checkpoint_id: int) -> None:
        with self._lock:
            if checkpoint_id > self.last_completed:
                self._by_checkpoint = {c: f for c, f in self._by_checkpoint.items() if c >= checkpoint_id}
                self.last_completed = checkpoint_id

    def abort(self, checkpoint_id: int) -> None:
        with self._lock:
            self._by_checkpoint.pop(checkpoint_id, None)


def rocksdb_identity(partition: RocksDBPartition) -> str:
    with open(os.path.join(partition.path, "IDENTITY")) as f:
        return f.read().strip()


class IncrementalSnapshotStrategy(SnapshotStrategy):
    """Flink's ``RocksIncrementalSnapshotStrategy`` over the frozen view's native checkpoint."""

    format: SnapshotFormat = "incremental"

    def __init__(self, uploaded: UploadedSstFiles) -> None:
        self.uploaded = uploaded

    def prepare(self, job: Job, ctx: SnapshotContext) -> AsyncSnapshot:
        partition = job.partition
        if not isinstance(partition, RocksDBPartition):
            raise TypeError("incremental checkpoints need the RocksDB backend")
        view = partition.freeze()
        path = view.path
        states = _states(job)
        tables = keyed_tables(view.tables())
        backend_uid = rocksdb_identity(partition)
        reusable = self.uploaded.reusable(backend_uid)
        names = sorted(os.listdir(path))
        ssts = [n for n in names if n.endswith(".sst")]
        placeholders = {n: reusable[n] for n in ssts if n in reusable}
        private_names = [n for n in names if not n.endswith(".sst")]

        def body() -> SnapshotResult:
            shared: dict[str, StreamHandle] = dict(placeholders)
            uploaded_bytes = 0
            for name in ssts:
                if name in placeholders:
                    continue
                ctx.check_cancelled()
                # A unique name per upload (Flink's physical id): an aborted attempt's file
                # can be deleted without touching another attempt's copy of the same SST.
                target = f"{shared_dir(ctx.job)}/{uuid.uuid4().hex}-{name}"
                ctx.written.append(target)
                handle = ctx.storage.put_file(target, os.path.join(path, name))
                shared[name] = handle
                uploaded_bytes += handle.size
            private: dict[str, StreamHandle] = {}
            for name in private_names:
                ctx.check_cancelled()
                target = ctx.part_path(f"db/{name}")
                ctx.written.append(target)
                handle = ctx.storage.put_file(target, os.path.join(path, name))
                private[name] = handle.relative_to(ctx.directory)
                uploaded_bytes += handle.size
            operator = _write_operator_state(view, ctx)
            uploaded_bytes += operator.size
            self.uploaded.add(ctx.checkpoint_id, backend_uid, shared)
            keyed = IncrementalHandle(
                backend_uid,
                job.key_group_range,
                ctx.checkpoint_id,
                {n: h.relative_to(ctx.directory) for n, h in shared.items()},
                private,
                tables,
            )
            reused = sum(h.size for h in placeholders.values())
            return SnapshotResult(
                "incremental",
                keyed,
                operator.relative_to(ctx.directory),
                states,
                job.max_parallelism,
                uploaded_bytes,
                reused,
            )

        return AsyncSnapshot(view, body)
