"""The checkpoint lifecycle of one replica: trigger, complete, abort, retain, restore.

One :class:`CheckpointManager` per server. It is the snapshot-strategy *runner* (Flink's
``SnapshotStrategyRunner`` + ``StreamOperatorStateHandler``) and the replica-side half of
the checkpoint coordinator: the Spark driver triggers checkpoint N on every replica, waits
until every replica reports ``uploaded``, then calls ``complete`` on each (Flink's
``notifyCheckpointComplete``), or ``abort``.

Threading: jobs are single-writer. :meth:`trigger` and :meth:`restore` touch the job's
partition and must run on the job's writer thread; trigger only freezes the state and
hands the upload to a background thread, so writes continue at once. The other methods
only touch storage and this manager's bookkeeping and may run on any thread.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Literal

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.errors import InvalidArgument, StateError
from statehouse.backends.rocksdb.partition import RocksDBPartition
from statehouse.keygroups import KeyGroupRange
from statehouse.snapshots.compression import codec
from statehouse.snapshots.errors import (
    CheckpointConflict,
    CheckpointFailed,
    CheckpointNotFound,
    CheckpointNotReady,
    SnapshotCorrupt,
)
from statehouse.snapshots.layout import (
    SnapshotKind,
    metadata_name,
    parse_job_listing,
    parse_metadata_name,
    parse_snapshot_dir_ids,
    part_name,
    snapshot_dir,
)
from statehouse.snapshots.metadata import SnapshotFormat, SnapshotMetadata
from statehouse.snapshots.registry import SharedStateRegistry
from statehouse.snapshots.restore import RestoreOperation, SnapshotPart
from statehouse.snapshots.storage import CheckpointStorage, open_storage
from statehouse.snapshots.strategies import (
    AsyncSnapshot,
    FullSnapshotStrategy,
    IncrementalSnapshotStrategy,
    SnapshotContext,
    SnapshotResult,
    UploadedSstFiles,
)

log = logging.getLogger(__name__)

CheckpointStatus = Literal["in_progress", "uploaded", "completed", "failed", "aborted"]
_PENDING: tuple[CheckpointStatus, ...] = ("in_progress", "uploaded")


class _Reportable:
    """A result the service returns as JSON."""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)  # type: ignore[call-overload]
        data["key_group_range"] = list(data["key_group_range"])
        return data


@dataclass
class CheckpointInfo(_Reportable):
    """This replica's view of one checkpoint or savepoint."""

    job: str
    checkpoint_id: int
    kind: SnapshotKind
    status: CheckpointStatus
    error: str | None = None
    bytes_uploaded: int = 0
    bytes_reused: int = 0
    duration_ms: int = 0
    location: str = ""
    format: SnapshotFormat = "full"
    replica_index: int = 0
    replica_count: int = 1
    key_group_range: tuple[int, int] = (0, -1)
    metadata: dict[str, Any] = field(default_factory=dict)  # given at trigger, kept in _metadata


@dataclass
class RestoreInfo(_Reportable):
    job: str
    checkpoint_id: int
    kind: SnapshotKind
    format: SnapshotFormat
    location: str
    max_parallelism: int
    key_group_range: tuple[int, int]
    parts: list[str]  # the replica parts read, e.g. "replica-0-of-2"
    entries_restored: int
    bytes_read: int
    duration_ms: int
    aborted_checkpoints: list[int]  # this replica's pending checkpoints of the job, aborted first


@dataclass
class _Attempt:
    info: CheckpointInfo
    ctx: SnapshotContext
    started: float
    future: Future | None = None
    result: SnapshotResult | None = None


@dataclass
class _JobCheckpoints:
    """Per job: attempts of this process, this replica's completed parts, shared files."""

    attempts: dict[int, _Attempt] = field(default_factory=dict)
    completed: dict[int, SnapshotMetadata] = field(default_factory=dict)
    known_ids: set[int] = field(default_factory=set)
    registry: SharedStateRegistry = field(default_factory=SharedStateRegistry)
    uploaded: UploadedSstFiles = field(default_factory=UploadedSstFiles)
    # completed checkpoint parts written under another replica count: id -> [(index, count)]
    foreign: dict[int, list[tuple[int, int]]] = field(default_factory=dict)


class CheckpointManager:
    def __init__(
        self,
        catalog: JobCatalog,
        storage: CheckpointStorage,
        *,
        num_retained: int = 3,
        compression: str = "zstd",
        incremental: bool = True,
        complete_timeout_s: float = 60.0,
        upload_threads: int = 2,
        work_dir: str | None = None,
        s3_endpoint_url: str | None = None,
    ) -> None:
        if num_retained < 1:
            raise ValueError("num_retained must be at least 1")
        self.catalog = catalog
        self.storage = storage
        self.num_retained = num_retained
        self.codec = codec(compression)
        self.incremental = incremental
        self.complete_timeout_s = complete_timeout_s
        self.work_dir = work_dir
        self.s3_endpoint_url = s3_endpoint_url
        self._lock = threading.RLock()
        self._jobs: dict[str, _JobCheckpoints] = {}
        self._executor = ThreadPoolExecutor(max_workers=upload_threads, thread_name_prefix="statehouse-snapshot")

    @property
    def _part(self) -> str:
        return part_name(self.catalog.replica_index, self.catalog.replica_count)

    # -- job bookkeeping, rebuilt from storage after a restart ----------------------------------

    def _state(self, job: str) -> _JobCheckpoints:
        with self._lock:
            state = self._jobs.get(job)
            if state is None:
                state = self._jobs[job] = self._load(job)
            return state

    def _load(self, job: str) -> _JobCheckpoints:
        state = _JobCheckpoints()
        listing = [p[len(job) + 1 :] for p in self.storage.list(job)]
        # Ids in use: this replica's own parts (complete or not), and every snapshot that was
        # completed under another replica count (ids keep increasing across a rescale).
        # Other replicas' parts of this layout are the same checkpoints, not conflicts.
        state.known_ids = parse_snapshot_dir_ids(listing, self._part)
        mine = (self.catalog.replica_index, self.catalog.replica_count)
        for kind, checkpoint_id, index, count in parse_job_listing(listing):
            if count != self.catalog.replica_count:
                state.known_ids.add(checkpoint_id)
                if kind == "checkpoint":
                    state.foreign.setdefault(checkpoint_id, []).append((index, count))
            if (index, count) != mine:
                continue
            directory = snapshot_dir(job, checkpoint_id, kind)
            try:
                state.completed[checkpoint_id] = self._read_metadata(self.storage, directory, metadata_name(*mine))
            except StateError as exc:
                log.warning("ignoring checkpoint %s of job %s: %s", checkpoint_id, job, exc)
        checkpoints = sorted(i for i, m in state.completed.items() if m.kind == "checkpoint")
        for checkpoint_id in checkpoints:
            self._register_shared(state, checkpoint_id, state.completed[checkpoint_id])
        if checkpoints:
            last = state.completed[checkpoints[-1]]
            if last.format == "incremental":
                directory = snapshot_dir(job, last.checkpoint_id, "checkpoint")
                shared = {n: h.under(directory) for n, h in last.shared_handles().items()}
                state.uploaded.add(last.checkpoint_id, last.keyed.backend_uid, shared)  # type: ignore[union-attr]
            state.uploaded.confirm(last.checkpoint_id)
        return state

    @staticmethod
    def _read_metadata(storage: CheckpointStorage, directory: str, name: str) -> SnapshotMetadata:
        path = f"{directory}/{name}" if directory else name
        try:
            data = storage.read(path)
        except FileNotFoundError:
            raise SnapshotCorrupt(f"snapshot metadata {path} is missing from {storage.location}") from None
        return SnapshotMetadata.from_bytes(data, f"{storage.location}/{path}")

    def _register_shared(self, state: _JobCheckpoints, checkpoint_id: int, metadata: SnapshotMetadata) -> None:
        directory = snapshot_dir(metadata.job, checkpoint_id, metadata.kind)
        for handle in metadata.shared_handles().values():
            root_handle = handle.under(directory)
            state.registry.register_reference(root_handle.path, root_handle, checkpoint_id)

    def _info_from_metadata(self, metadata: SnapshotMetadata, job: str) -> CheckpointInfo:
        return CheckpointInfo(
            job=job,
            checkpoint_id=metadata.checkpoint_id,
            kind=metadata.kind,
            status="completed",
            bytes_uploaded=metadata.bytes_uploaded,
            bytes_reused=metadata.bytes_reused,
            duration_ms=metadata.duration_ms,
            location=self._location(snapshot_dir(job, metadata.checkpoint_id, metadata.kind)),
            format=metadata.format,
            replica_index=metadata.replica_index,
            replica_count=metadata.replica_count,
            key_group_range=(metadata.key_group_range.start, metadata.key_group_range.end),
            metadata=metadata.user_metadata,
        )

    def _location(self, directory: str) -> str:
        return f"{self.storage.location.rstrip('/')}/{directory}"

    # -- trigger -------------------------------------------------------------------------------

    def trigger(
        self,
        job: str,
        checkpoint_id: int | None = None,
        kind: SnapshotKind = "checkpoint",
        metadata: dict[str, Any] | None = None,
    ) -> CheckpointInfo:
        """Freeze the job's state now and upload it in the background; returns ``in_progress``.

        Savepoints always use the canonical full format. Ids must be newer than every
        checkpoint or savepoint of the job this replica knows (in memory or in storage).
        """
        live = self.catalog.get(job)
        if kind not in ("checkpoint", "savepoint"):
            raise InvalidArgument(f"kind must be 'checkpoint' or 'savepoint'; got {kind!r}")
        if checkpoint_id is not None and (
            isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 1
        ):
            raise InvalidArgument(f"checkpoint_id must be a positive integer; got {checkpoint_id!r}")
        state = self._state(job)
        with self._lock:
            latest = max(state.known_ids | set(state.attempts) | set(state.completed), default=0)
            if checkpoint_id is None:
                checkpoint_id = latest + 1
            elif checkpoint_id in state.known_ids or checkpoint_id in state.attempts:
                raise CheckpointConflict(f"checkpoint {checkpoint_id} of job {job!r} exists already")
            elif checkpoint_id < latest:
                raise CheckpointConflict(
                    f"checkpoint ids must increase: job {job!r} already has checkpoint {latest}; "
                    f"use an id above {latest}"
                )
            state.known_ids.add(checkpoint_id)
            use_incremental = kind == "checkpoint" and self.incremental and isinstance(live.partition, RocksDBPartition)
            strategy = IncrementalSnapshotStrategy(state.uploaded) if use_incremental else FullSnapshotStrategy()
            directory = snapshot_dir(job, checkpoint_id, kind)
            ctx = SnapshotContext(self.storage, job, checkpoint_id, kind, directory, self._part, self.codec)
            info = CheckpointInfo(
                job=job,
                checkpoint_id=checkpoint_id,
                kind=kind,
                status="in_progress",
                location=self._location(directory),
                format=strategy.format,
                replica_index=self.catalog.replica_index,
                replica_count=self.catalog.replica_count,
                key_group_range=(live.key_group_range.start, live.key_group_range.end),
                metadata=dict(metadata or {}),
            )
            attempt = state.attempts[checkpoint_id] = _Attempt(info, ctx, time.monotonic())
            try:
                async_part = strategy.prepare(live, ctx)  # the synchronous part
            except Exception as exc:
                log.exception("synchronous part of checkpoint %s of job %s failed", checkpoint_id, job)
                self._fail(attempt, exc)
                return dataclasses.replace(info)
            attempt.future = self._executor.submit(self._upload, state, attempt, async_part)
            return dataclasses.replace(info)

    def _upload(self, state: _JobCheckpoints, attempt: _Attempt, async_part: AsyncSnapshot) -> None:
        try:
            result = async_part.run()
        except Exception as exc:
            with self._lock:
                if attempt.info.status == "aborted":
                    return
                if not isinstance(exc, InterruptedError):
                    log.warning("checkpoint %s of job %s failed: %s", attempt.info.checkpoint_id, attempt.info.job, exc)
                self._fail(attempt, exc)
            self._discard_files(attempt)
            return
        with self._lock:
            if attempt.info.status == "aborted":
                return
            attempt.result = result
            attempt.info.status = "uploaded"
            attempt.info.bytes_uploaded = result.bytes_uploaded
            attempt.info.bytes_reused = result.bytes_reused
            attempt.info.duration_ms = int((time.monotonic() - attempt.started) * 1000)

    def _fail(self, attempt: _Attempt, exc: BaseException) -> None:
        attempt.info.status = "failed"
        detail = exc.detail if isinstance(exc, StateError) else str(exc)
        attempt.info.error = f"{type(exc).__name__}: {detail}"
        attempt.info.duration_ms = int((time.monotonic() - attempt.started) * 1000)

    def _discard_files(self, attempt: _Attempt) -> None:
        """Delete what an unsuccessful attempt wrote (its uploads are registered nowhere)."""
        try:
            self.storage.delete(attempt.ctx.written)
        except Exception as exc:  # best effort: storage may be what failed
            log.warning("could not delete the files of checkpoint %s: %s", attempt.info.checkpoint_id, exc)

    # -- queries -------------------------------------------------------------------------------

    def get(self, job: str, checkpoint_id: int) -> CheckpointInfo:
        state = self._state(job)
        with self._lock:
            attempt = state.attempts.get(checkpoint_id)
            if attempt is not None:
                return dataclasses.replace(attempt.info)
            metadata = state.completed.get(checkpoint_id)
            if metadata is not None:
                return self._info_from_metadata(metadata, job)
        raise CheckpointNotFound(
            f"job {job!r} has no checkpoint {checkpoint_id} on replica {self.catalog.replica_index}"
        )

    def list(self, job: str) -> list[CheckpointInfo]:
        """Checkpoints and savepoints of this replica: this process's attempts and the completed ones in storage."""
        state = self._state(job)
        with self._lock:
            infos = {i: self._info_from_metadata(m, job) for i, m in state.completed.items()}
            infos.update({i: dataclasses.replace(a.info) for i, a in state.attempts.items()})
        return [infos[i] for i in sorted(infos)]

    def next_checkpoint_id(self, job: str) -> int:
        """The smallest id a new checkpoint of the job may take here (ids only grow, across rescales too)."""
        state = self._state(job)
        with self._lock:
            return 1 + max(state.known_ids | set(state.attempts) | set(state.completed), default=0)

    def wait(self, job: str, checkpoint_id: int, timeout: float | None = None) -> CheckpointInfo:
        """Wait until the upload of a checkpoint finished (or ``timeout`` passed); returns its info."""
        state = self._state(job)
        with self._lock:
            attempt = state.attempts.get(checkpoint_id)
        if attempt is not None and attempt.future is not None:
            with contextlib.suppress(FutureTimeout):
                attempt.future.result(timeout)
        return self.get(job, checkpoint_id)

    # -- complete / abort ----------------------------------------------------------------------

    def complete(self, job: str, checkpoint_id: int) -> CheckpointInfo:
        """notifyCheckpointComplete: write this replica's ``_metadata`` (last), retain, clean up.

        Waits for a still-running upload up to ``complete_timeout_s``. Repeated calls are
        harmless (notifications may be repeated).
        """
        state = self._state(job)
        info = self.wait(job, checkpoint_id, self.complete_timeout_s)
        if info.status == "completed":
            return info
        if info.status == "in_progress":
            raise CheckpointNotReady(
                f"checkpoint {checkpoint_id} of job {job!r} is still uploading after {self.complete_timeout_s:.0f} s; "
                "retry complete later"
            )
        if info.status in ("failed", "aborted"):
            raise CheckpointFailed(
                f"checkpoint {checkpoint_id} of job {job!r} is {info.status}"
                + (f" ({info.error})" if info.error else "")
                + "; it cannot complete, trigger a new one"
            )
        with self._lock:
            attempt = state.attempts[checkpoint_id]
            result = attempt.result
            assert result is not None
            if attempt.info.status == "completed":
                return dataclasses.replace(attempt.info)
            live_range = attempt.info.key_group_range
            metadata = SnapshotMetadata(
                job=job,
                checkpoint_id=checkpoint_id,
                kind=attempt.info.kind,
                format=result.format,
                replica_index=self.catalog.replica_index,
                replica_count=self.catalog.replica_count,
                max_parallelism=result.max_parallelism,
                key_group_range=KeyGroupRange(*live_range),
                backend=self.catalog.store.name,
                timestamp_ms=int(time.time() * 1000),
                states=result.states,
                keyed=result.keyed,
                operator=result.operator,
                bytes_uploaded=result.bytes_uploaded,
                bytes_reused=result.bytes_reused,
                duration_ms=attempt.info.duration_ms,
                user_metadata=attempt.info.metadata,
            )
            if metadata.kind == "checkpoint":
                # Flink registers shared state before finalizing: from here the files are retained.
                self._register_shared(state, checkpoint_id, metadata)
        # The metadata goes last: only now is this part of the checkpoint restorable.
        with self.storage.create_output(f"{attempt.ctx.directory}/{metadata_name(*self._replica)}") as out:
            out.write(metadata.to_bytes())
            out.close_and_get_handle()
        with self._lock:
            attempt.info.status = "completed"
            state.completed[checkpoint_id] = metadata
            if metadata.kind == "checkpoint":
                state.uploaded.confirm(checkpoint_id)
                subsumed = [
                    a
                    for i, a in state.attempts.items()
                    if i < checkpoint_id and a.info.kind == "checkpoint" and a.info.status in _PENDING
                ]
            else:
                subsumed = []
            done = dataclasses.replace(attempt.info)
        for older in subsumed:  # Flink's dropSubsumedCheckpoints
            self._abort_attempt(state, older)
        if metadata.kind == "checkpoint":
            self._retain(state, job)
        return done

    @property
    def _replica(self) -> tuple[int, int]:
        return self.catalog.replica_index, self.catalog.replica_count

    def _retain(self, state: _JobCheckpoints, job: str) -> None:
        """Keep the newest ``num_retained`` completed checkpoints; delete unreachable shared files."""
        with self._lock:
            checkpoints = sorted(i for i, m in state.completed.items() if m.kind == "checkpoint")
            subsumed = checkpoints[: max(0, len(checkpoints) - self.num_retained)]
            for checkpoint_id in subsumed:
                del state.completed[checkpoint_id]
            lowest = checkpoints[len(subsumed)]
            unused = state.registry.unregister_unused(lowest)
            for i in [i for i, a in state.attempts.items() if i < lowest and a.info.status not in _PENDING]:
                if state.attempts[i].info.kind == "checkpoint":
                    del state.attempts[i]  # bounded memory; completed ones are still listed from storage
        for checkpoint_id in subsumed:
            directory = snapshot_dir(job, checkpoint_id, "checkpoint")
            try:
                # Metadata first: a half-deleted checkpoint must never look restorable.
                self.storage.delete([f"{directory}/{metadata_name(*self._replica)}"])
                self.storage.delete_prefix(f"{directory}/{self._part}")
            except Exception as exc:
                log.warning("could not delete subsumed checkpoint %s of job %s: %s", checkpoint_id, job, exc)
        try:
            self.storage.delete([h.path for h in unused])
        except Exception as exc:
            log.warning("could not delete %d unused shared files of job %s: %s", len(unused), job, exc)
        if state.foreign and self.catalog.replica_index == 0:
            self._retain_foreign(state, job, checkpoints[len(subsumed) :])

    def _retain_foreign(self, state: _JobCheckpoints, job: str, retained: builtins.list[int]) -> None:
        """After a rescale, replica 0 also subsumes the checkpoints of the old replica layout.

        Their replicas are gone, so nobody else will. They count towards ``num_retained``
        with this layout's checkpoints (all newer); their shared files go once no remaining
        old-layout checkpoint references them.
        """
        keep = set(sorted(set(retained) | set(state.foreign))[-self.num_retained :])
        doomed = sorted(i for i in state.foreign if i not in keep)
        if not doomed:
            return

        def shared_of(checkpoint_id: int, index: int, count: int) -> set[str]:
            directory = snapshot_dir(job, checkpoint_id, "checkpoint")
            try:
                metadata = self._read_metadata(self.storage, directory, metadata_name(index, count))
            except StateError:
                return set()
            return {h.under(directory).path for h in metadata.shared_handles().values()}

        still_used = set()
        for checkpoint_id in state.foreign:
            if checkpoint_id in keep:
                for index, count in state.foreign[checkpoint_id]:
                    still_used |= shared_of(checkpoint_id, index, count)
        for checkpoint_id in doomed:
            directory = snapshot_dir(job, checkpoint_id, "checkpoint")
            parts = state.foreign[checkpoint_id]
            try:
                shared = set().union(*(shared_of(checkpoint_id, i, n) for i, n in parts))
                self.storage.delete([f"{directory}/{metadata_name(i, n)}" for i, n in parts])
                for index, count in parts:
                    self.storage.delete_prefix(f"{directory}/{part_name(index, count)}")
                self.storage.delete(sorted(shared - still_used))
            except Exception as exc:
                log.warning("could not delete old-layout checkpoint %s of job %s: %s", checkpoint_id, job, exc)
                continue
            with self._lock:
                del state.foreign[checkpoint_id]

    def abort(self, job: str, checkpoint_id: int) -> CheckpointInfo:
        """notifyCheckpointAborted: stop the upload and discard what this attempt wrote."""
        state = self._state(job)
        with self._lock:
            attempt = state.attempts.get(checkpoint_id)
            if attempt is None:
                if checkpoint_id in state.completed:
                    raise CheckpointConflict(f"checkpoint {checkpoint_id} of job {job!r} is completed; it cannot abort")
                raise CheckpointNotFound(f"job {job!r} has no checkpoint {checkpoint_id}")
            if attempt.info.status == "completed":
                raise CheckpointConflict(f"checkpoint {checkpoint_id} of job {job!r} is completed; it cannot abort")
        self._abort_attempt(state, attempt)
        return self.get(job, checkpoint_id)

    def _abort_attempt(self, state: _JobCheckpoints, attempt: _Attempt) -> None:
        with self._lock:
            if attempt.info.status in ("aborted", "completed"):
                return
            attempt.ctx.cancel.set()
        if attempt.future is not None:
            try:
                attempt.future.result(self.complete_timeout_s)
            except FutureTimeout:
                log.warning("checkpoint %s still uploading after abort", attempt.info.checkpoint_id)
        with self._lock:
            attempt.info.status = "aborted"
            state.uploaded.abort(attempt.info.checkpoint_id)
        self._discard_files(attempt)

    # -- restore -------------------------------------------------------------------------------

    def restore(
        self,
        job: str,
        checkpoint_id: int | None = None,
        location: str | None = None,
        operator_parallelism: dict[str, int] | None = None,
    ) -> RestoreInfo:
        """Replace the job's state on this replica with its key groups of a completed snapshot.

        From ``location`` (a snapshot directory: a checkpoint's or savepoint's ``location``),
        else from checkpoint or savepoint ``checkpoint_id`` of this job in the configured
        storage, else from the job's latest completed checkpoint. Every replica part found
        is used, whatever replica count wrote it (rescaling). Runs on the writer thread.
        """
        started = time.monotonic()
        if location is not None:
            storage = open_storage(location, s3_endpoint_url=self.s3_endpoint_url)
            directory = ""
        else:
            storage = self.storage
            directory = self._find_snapshot(job, checkpoint_id)
        parts = self._read_parts(storage, directory)
        if not parts:
            where = location or self._location(directory)
            raise CheckpointNotFound(f"no completed snapshot part (no _metadata.replica-*) at {where}")
        read_before = storage.bytes_read
        operation = RestoreOperation(
            self.catalog, storage, job, parts, operator_parallelism=operator_parallelism, work_dir=self.work_dir
        )
        staged = operation.run()  # fetched, verified and built beside the live job
        try:
            aborted = self._quiesce(job)
        except BaseException:
            self.catalog.discard(staged)
            raise
        restored = self.catalog.swap(job, staged)
        first = parts[0].metadata
        return RestoreInfo(
            job=job,
            checkpoint_id=first.checkpoint_id,
            kind=first.kind,
            format=first.format,
            location=location or self._location(directory),
            max_parallelism=restored.max_parallelism,
            key_group_range=(restored.key_group_range.start, restored.key_group_range.end),
            parts=[part_name(p.metadata.replica_index, p.metadata.replica_count) for p in parts],
            entries_restored=operation.entries,
            bytes_read=storage.bytes_read - read_before,
            duration_ms=int((time.monotonic() - started) * 1000),
            aborted_checkpoints=aborted,
        )

    def _find_snapshot(self, job: str, checkpoint_id: int | None) -> str:
        listing = [p[len(job) + 1 :] for p in self.storage.list(job)]
        entries = parse_job_listing(listing)
        if checkpoint_id is None:
            ids = [i for kind, i, _r, _n in entries if kind == "checkpoint"]
            if not ids:
                raise CheckpointNotFound(f"job {job!r} has no completed checkpoint in {self.storage.location}")
            return snapshot_dir(job, max(ids), "checkpoint")
        for kind in ("checkpoint", "savepoint"):
            if any(k == kind and i == checkpoint_id for k, i, _r, _n in entries):
                return snapshot_dir(job, checkpoint_id, kind)
        raise CheckpointNotFound(
            f"job {job!r} has no completed checkpoint or savepoint {checkpoint_id} in {self.storage.location}"
        )

    def _read_parts(self, storage: CheckpointStorage, directory: str) -> builtins.list[SnapshotPart]:
        prefix = f"{directory}/" if directory else ""
        names = [p[len(prefix) :] for p in storage.list(directory) if "/" not in p[len(prefix) :]]
        parts = [
            SnapshotPart(directory, self._read_metadata(storage, directory, name))
            for name in sorted(names)
            if parse_metadata_name(name)
        ]
        # Parts of one snapshot come from one replica layout; if a directory has two, use the newest.
        counts = {p.metadata.replica_count for p in parts}
        if len(counts) > 1:
            newest = max(parts, key=lambda p: p.metadata.timestamp_ms).metadata.replica_count
            parts = [p for p in parts if p.metadata.replica_count == newest]
        return parts

    def _quiesce(self, job: str) -> builtins.list[int]:
        """Before replacing a job's state: abort this replica's pending checkpoints of it (they
        froze the state being replaced, so completing one later would be wrong); their ids."""
        state = self._state(job)
        with self._lock:
            pending = [a for a in state.attempts.values() if a.info.status in _PENDING]
        for attempt in pending:
            self._abort_attempt(state, attempt)
        return sorted(a.info.checkpoint_id for a in pending)

    # -- shutdown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for in-flight uploads (graceful shutdown); the storage stays open."""
        self._executor.shutdown(wait=True)
