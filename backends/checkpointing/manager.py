"""The checkpoint lifecycle of one replica: trigger, complete, abort, and restore.

One :class:`CheckpointManager` per server: the replica-side half of the checkpoint
coordinator. The Spark driver triggers checkpoint N on every replica, waits until every
replica reports ``uploaded``, then calls ``complete`` on each (Flink's
``notifyCheckpointComplete``), or ``abort``. The pieces it drives:

* the job's store picks the strategy (:meth:`~statehouse.backends.base.store.Store.snapshot_strategy`),
  the :class:`~statehouse.backends.checkpointing.runner.SnapshotStrategyRunner` runs it;
* :class:`~statehouse.backends.checkpointing.catalog.SnapshotCatalog` reads what storage holds (after a restart);
* :class:`~statehouse.backends.checkpointing.retention.CompletedCheckpoints` keeps the newest parts and their files;
* :class:`~statehouse.backends.checkpointing.restore.RestoreOperation` builds a restored job, the job
  catalog swaps it in.

Every method may run on any thread: a freeze holds off the job's writes itself. (About 330
lines: the lifecycle's rules — ids only grow, metadata last, subsumption, restore quiescing —
read best side by side.)
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from statehouse.backends.bounds import MAX_CHECKPOINT_ID, check_range
from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing.catalog import SnapshotCatalog
from statehouse.backends.checkpointing.cleaner import CheckpointCleaner
from statehouse.backends.checkpointing.info import CheckpointInfo, RestoreInfo
from statehouse.backends.checkpointing.pending import PendingCheckpoint
from statehouse.backends.checkpointing.restore import MergeRestore, RestoreOperation
from statehouse.backends.checkpointing.retention import CompletedCheckpoints
from statehouse.backends.checkpointing.runner import SnapshotStrategyRunner
from statehouse.backends.errors import JobNotFound, JobReplaced
from statehouse.backends.job import Job
from statehouse.backends.snapshot.full_strategy import JobStrategy
from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.catalog import read_parts
from statehouse.snapshots.compression import codec
from statehouse.snapshots.errors import (
    CheckpointConflict,
    CheckpointFailed,
    CheckpointNotFound,
    CheckpointNotReady,
)
from statehouse.snapshots.layout import SnapshotKind, metadata_name, part_name, snapshot_dir
from statehouse.snapshots.metadata import SnapshotMetadata, SnapshotPart
from statehouse.snapshots.storage.base import CheckpointStorage
from statehouse.snapshots.storage.locations import RestoreLocations
from statehouse.snapshots.storage.timeouts import S3Timeouts
from statehouse.snapshots.strategy import Seed, SeedContext, SnapshotContext

log = logging.getLogger(__name__)


@dataclass
class _JobCheckpoints:
    """Per job: the attempts of this process, the ids taken, the completed parts."""

    completed: CompletedCheckpoints
    known_ids: set[int]
    attempts: dict[int, PendingCheckpoint] = field(default_factory=dict)
    # Held while one of the job's checkpoints completes or aborts here: a completion aborts the
    # older pending ones (subsumes them), and one of those must not be halfway through its own
    # completion then (its files deleted under the metadata it writes).
    finishing: threading.Lock = field(default_factory=threading.Lock)

    def latest_id(self) -> int:
        return max(self.known_ids | set(self.attempts) | set(self.completed.all()), default=0)


class CheckpointManager:
    """One replica's checkpoints and savepoints of every job (Flink's ``CheckpointCoordinator``
    as far as a replica takes part): triggers a snapshot with the strategy the job's store picks,
    completes or aborts it when the driver says so, keeps the ``num_retained`` newest completed
    parts per job (and the shared files they reference), restores a job from any snapshot in
    storage or an allowed location, and loads a live rescale's key groups. Holds one thread pool
    for the snapshots' asynchronous parts; :meth:`close` stops it."""

    def __init__(
        self,
        catalog: JobCatalog,
        storage: CheckpointStorage,
        *,
        num_retained: int = 3,
        compression: str = "zstd",
        complete_timeout_s: float = 60.0,
        upload_threads: int = 2,
        work_dir: str | None = None,
        s3_endpoint_url: str | None = None,
        restore_locations: tuple[str, ...] = (),
        s3_timeouts: S3Timeouts | None = None,
    ) -> None:
        if num_retained < 1:
            raise ValueError("num_retained must be at least 1")
        self.catalog = catalog
        self.storage = storage
        self.num_retained = num_retained
        self.codec = codec(compression)
        self.complete_timeout_s = complete_timeout_s
        self.work_dir = work_dir
        self.snapshots = SnapshotCatalog(storage, catalog.replica_index, catalog.replica_count)
        self.locations = RestoreLocations(
            storage, s3_endpoint_url=s3_endpoint_url, allowed=restore_locations, s3_timeouts=s3_timeouts
        )
        self._runner = SnapshotStrategyRunner(upload_threads)
        self._cleaner = CheckpointCleaner()
        self._lock = threading.RLock()
        self._jobs: dict[str, _JobCheckpoints] = {}
        # The live rescale pending here, whose checkpoints (their metadata's rescale_version) are
        # kept past num_retained until it ends: its loads read them while the query checkpoints.
        self._held_version: int | None = None
        # Per job, files uploaded ahead of its next checkpoint here (kept across a relayout).
        self._seeds: dict[str, Seed] = {}
        # Bases written in the background, one at a time: the job one is written for, its stop.
        self._materializer = ThreadPoolExecutor(1, thread_name_prefix="materialize")
        self._materializing: set[str] = set()
        self._cancel_seeds = threading.Event()
        self._closed = False
        storage.sweep_abandoned()  # S3: abort what a failed or killed process left uploading (billed)

    @property
    def _replica(self) -> tuple[int, int]:
        return self.catalog.replica_index, self.catalog.replica_count

    def _state(self, job: str, listing: builtins.list[str] | None = None) -> _JobCheckpoints:
        """The job's bookkeeping, read from storage the first time (after a restart or a live
        rescale); ``listing``: the job's files in storage, when the caller listed them already."""
        with self._lock:
            state = self._jobs.get(job)
            if state is None:
                history = self.snapshots.history(job, listing)
                completed = CompletedCheckpoints(
                    job, self.storage, self._replica, self.num_retained, history, self._cleaner
                )
                state = self._jobs[job] = _JobCheckpoints(completed, history.known_ids)
            return state

    def hold_for(self, version: int) -> None:
        """Keep the checkpoints of the live rescale to topology ``version`` until :meth:`release_held`."""
        with self._lock:
            self._held_version = version

    def release_held(self) -> None:
        """A live rescale ended: its checkpoints are retained as any others again."""
        with self._lock:
            self._held_version = None
            states = list(self._jobs.values())
        for state in states:
            state.completed.release()

    def relayout(self) -> None:
        """The catalog's replica index or count changed (a live rescale committed): later
        checkpoints are parts of the new layout, and what this process knew of the old layout's
        parts is read again from storage (they stay there, restorable; ids keep increasing),
        once what retention let go is deleted."""
        self._cleaner.drain()
        with self._lock:
            self.snapshots = SnapshotCatalog(self.storage, self.catalog.replica_index, self.catalog.replica_count)
            self._jobs.clear()

    def seed(self, job: str, key_groups: Sequence[KeyGroupRange], joining: bool) -> int:
        """Upload what ``job``'s next checkpoint holding ``key_groups`` (what a live rescale's copy
        loaded here; the job need not be served) would upload and this replica's checkpoints do
        not hold yet, for that checkpoint to reuse: a joining replica's, or any replica's where
        the backend seeds the key groups it takes. Bytes uploaded."""
        strategy = self.catalog.store.snapshot_strategy("checkpoint")
        if not (joining or strategy.seeds_taken_key_groups):
            return 0
        live = self.catalog.get(job, serving=False)
        state = self._state(job)
        previous = state.completed.latest_checkpoint()
        seed = strategy.seed(live, SeedContext(self.storage, job, previous, key_groups, self.codec))
        if seed is None:
            return 0
        with self._lock:
            replaced = self._seeds.pop(job, None)
            self._seeds[job] = seed
        if replaced is not None:  # a second copy of the same move: the first one's files go
            self._delete_seed(job, replaced)
        return sum(h.size for h in seed.files.values())

    def discard_seeds(self) -> None:
        """Let go of the seeds of checkpoints that will not come (a move aborted): what the backend
        keeps for them, and their files."""
        with self._lock:
            seeds, self._seeds = self._seeds, {}
        strategy = self.catalog.store.snapshot_strategy("checkpoint")
        for job, seed in seeds.items():
            with contextlib.suppress(JobNotFound):  # a job deleted meanwhile keeps nothing
                strategy.unseed(self.catalog.get(job, serving=False), seed)
            self._delete_seed(job, seed)

    def _materialize_if_due(self, job: str, state: _JobCheckpoints) -> None:
        """Have the backend write a new base of the job in the background if it says one is due
        after its latest checkpoint (a heap's deltas grew to half what makes a base): a later
        checkpoint chains on it (as on a live rescale's seed) instead of writing one inline, on
        a micro-batch's path. One at a time on the replica; none during a live rescale or while
        a seed waits for its checkpoint."""
        strategy = self.catalog.store.snapshot_strategy("checkpoint")
        previous = state.completed.latest_checkpoint()
        if previous is None or not strategy.materialization_due(previous):
            return
        with self._lock:
            if self._closed or job in self._seeds or self._materializing or self._held_version is not None:
                return
            self._materializing.add(job)
        try:
            live = self.catalog.get(job, serving=False)
            self._materializer.submit(self._materialize, job, live, state, strategy, previous)
        except BaseException:
            with self._lock:
                self._materializing.discard(job)
            raise

    def _materialize(
        self, job: str, live: Job, state: _JobCheckpoints, strategy: JobStrategy, previous: SnapshotPart
    ) -> None:
        """The background part of :meth:`_materialize_if_due`: the seed, kept for the job's next
        checkpoint unless something made it moot meanwhile (a base written inline, a restore, a
        move), then its files are deleted."""
        ctx = SeedContext(
            self.storage, job, previous, [live.key_group_range], self.codec, self._cancel_seeds, self.work_dir
        )
        try:
            seed = strategy.materialize(live, ctx)
        except Exception as exc:  # the checkpoints go on: one writes the base inline when due
            log.warning("the background base of job %s failed: %s", job, exc)
            return
        finally:
            with self._lock:
                self._materializing.discard(job)
        if seed is None:
            return
        latest = state.completed.latest_checkpoint()
        with self._lock:
            current = self._jobs.get(job) is state and self.catalog.get(job, serving=False) is live
            due = latest is not None and strategy.materialization_due(latest)
            kept = current and due and job not in self._seeds and self._held_version is None and not self._closed
            if kept:
                self._seeds[job] = seed
        if kept:
            log.info("a new base of job %s is written: its next checkpoint chains on it", job)
            return
        self._delete_seed(job, seed)
        strategy.unseed(live, seed)

    def _delete_seed(self, job: str, seed: Seed) -> None:
        try:
            self.storage.delete(sorted(h.path for h in seed.files.values()))
        except Exception as exc:
            log.warning("could not delete %d files uploaded ahead for job %s: %s", len(seed.files), job, exc)

    def _info_from_metadata(self, metadata: SnapshotMetadata) -> CheckpointInfo:
        directory = snapshot_dir(metadata.job, metadata.checkpoint_id, metadata.kind)
        return CheckpointInfo.completed(metadata, self.snapshots.location(directory))

    # -- trigger -------------------------------------------------------------------------------

    def trigger(
        self,
        job: str,
        checkpoint_id: int | None = None,
        kind: SnapshotKind = "checkpoint",
        metadata: dict[str, Any] | None = None,
    ) -> CheckpointInfo:
        """Freeze the job's state now and upload it in the background; returns ``in_progress``
        (``failed`` if the freeze failed).

        Savepoints always use the canonical full format. Ids must be newer than every
        checkpoint or savepoint of the job this replica knows (in memory or in storage).
        """
        live = self.catalog.get(job)
        if kind not in ("checkpoint", "savepoint"):
            raise InvalidArgument(f"kind must be 'checkpoint' or 'savepoint'; got {kind!r}")
        if checkpoint_id is not None:
            check_range(checkpoint_id, "checkpoint_id", MAX_CHECKPOINT_ID, 1)
        state = self._state(job)
        strategy = self.catalog.store.snapshot_strategy(kind)
        with self._lock:
            latest = state.latest_id()
            if checkpoint_id is None:
                if latest >= MAX_CHECKPOINT_ID:
                    raise CheckpointConflict(
                        f"job {job!r} has checkpoint {latest}, the largest id ({MAX_CHECKPOINT_ID}): no id follows it; "
                        "take later checkpoints under a new job name (restore this one's there)"
                    )
                checkpoint_id = latest + 1
            elif checkpoint_id in state.known_ids or checkpoint_id in state.attempts:
                raise CheckpointConflict(f"checkpoint {checkpoint_id} of job {job!r} exists already")
            elif checkpoint_id < latest:
                raise CheckpointConflict(
                    f"checkpoint ids must increase: job {job!r} already has checkpoint {latest}; "
                    f"use an id above {latest}"
                )
            state.known_ids.add(checkpoint_id)
            directory = snapshot_dir(job, checkpoint_id, kind)
            seed = self._seeds.get(job) if kind == "checkpoint" else None
            if seed is not None and all(r.intersection(live.key_group_range) == r for r in seed.key_groups()):
                # The first checkpoint that holds its key groups (not the layout before's, taken
                # during the move) takes it.
                self._seeds.pop(job)
            else:
                seed = None
            if seed is not None:
                state.completed.register_seed(seed)
            ctx = SnapshotContext(
                self.storage,
                job,
                checkpoint_id,
                kind,
                directory,
                self.snapshots.part,
                self.codec,
                previous=state.completed.latest_checkpoint(),
                seed=seed,
            )
            info = CheckpointInfo(
                job=job,
                checkpoint_id=checkpoint_id,
                kind=kind,
                status="in_progress",
                location=self.snapshots.location(directory),
                format=strategy.format,
                replica_index=self.catalog.replica_index,
                replica_count=self.catalog.replica_count,
                key_group_range=(live.key_group_range.start, live.key_group_range.end),
                metadata=dict(metadata or {}),
            )
            attempt = state.attempts[checkpoint_id] = PendingCheckpoint(info, ctx)
            accepted = attempt.info()
        try:
            attempt.future = self._runner.snapshot(live, strategy, ctx, attempt.uploaded)
        except JobReplaced:  # a restore swapped the job meantime: nothing was frozen, retry
            with self._lock:
                del state.attempts[checkpoint_id]
                state.known_ids.discard(checkpoint_id)
            raise
        except Exception as exc:
            log.exception("synchronous part of checkpoint %s of job %s failed", checkpoint_id, job)
            attempt.fail(exc)
            return attempt.info()
        # As of the end of the synchronous part, whatever the upload has done since: a trigger
        # answers alike however fast the storage (a wait for the upload is the caller's).
        return accepted

    # -- queries -------------------------------------------------------------------------------

    def ended(self, job: str, checkpoint_id: int) -> Future[None] | None:
        """A future done once the report of this process's attempt at checkpoint N has left
        ``in_progress``; None if there is no such attempt still in progress."""
        state = self._state(job)
        with self._lock:
            attempt = state.attempts.get(checkpoint_id)
        if attempt is None or attempt.ended.done():
            return None
        return attempt.ended

    def get(self, job: str, checkpoint_id: int) -> CheckpointInfo:
        state = self._state(job)
        with self._lock:
            attempt = state.attempts.get(checkpoint_id)
        if attempt is not None:
            return attempt.info()
        metadata = state.completed.get(checkpoint_id)
        if metadata is not None:
            return self._info_from_metadata(metadata)
        raise CheckpointNotFound(
            f"job {job!r} has no checkpoint {checkpoint_id} on replica {self.catalog.replica_index}"
        )

    def list(self, job: str, after: int | None = None, *, every_layout: bool = False) -> builtins.list[CheckpointInfo]:
        """Checkpoints and savepoints of this replica with ids above ``after``, oldest first:
        this process's attempts and the completed ones in storage. ``every_layout``: also those
        completed by every replica of another replica count (before a rescale), still in storage
        and restorable; each described by its replica 0's part (its ``replica_count`` says which
        layout wrote it)."""
        # Every layout's: one listing of storage serves this replica's history (read again after a
        # live rescale) and the other layouts' parts, read once what retention let go is deleted (a
        # listing never shows a part already subsumed; this layout's come from memory, which never does).
        listing = None
        if every_layout:
            self._cleaner.drain()
            listing = self.snapshots.listing(job)
        state = self._state(job, listing)
        infos = {i: self._info_from_metadata(m) for i, m in state.completed.all().items()}
        with self._lock:
            attempts = dict(state.attempts)
        infos.update({i: a.info() for i, a in attempts.items()})
        if every_layout:
            for metadata in self.snapshots.other_layouts(job, listing):
                infos.setdefault(metadata.checkpoint_id, self._info_from_metadata(metadata))
        return [infos[i] for i in sorted(infos) if after is None or i > after]

    def next_checkpoint_id(self, job: str) -> int:
        """The smallest id a new checkpoint of the job may take here (ids only grow, across rescales too)."""
        state = self._state(job)
        with self._lock:
            return 1 + state.latest_id()

    def wait(self, job: str, checkpoint_id: int, timeout: float | None = None) -> CheckpointInfo:
        """Wait until the upload of a checkpoint finished (or ``timeout`` passed); returns its info."""
        state = self._state(job)
        with self._lock:
            attempt = state.attempts.get(checkpoint_id)
        if attempt is not None:
            attempt.wait(timeout)
        return self.get(job, checkpoint_id)

    # -- complete / abort ----------------------------------------------------------------------

    def complete(self, job: str, checkpoint_id: int) -> CheckpointInfo:
        """notifyCheckpointComplete: write this replica's ``_metadata`` (last), retain, clean up.

        Waits for a still-running upload up to ``complete_timeout_s``. Repeated calls are
        harmless (notifications may be repeated).
        """
        state = self._state(job)
        self.wait(job, checkpoint_id, self.complete_timeout_s)
        with state.finishing:
            info = self._complete(state, job, checkpoint_id)
        if info.kind == "checkpoint":
            self._materialize_if_due(job, state)
        return info

    def _complete(self, state: _JobCheckpoints, job: str, checkpoint_id: int) -> CheckpointInfo:
        info = self.get(job, checkpoint_id)  # as it is now: another completion may have subsumed it
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
        metadata = attempt.metadata(self.catalog.store.name)
        if metadata.kind == "checkpoint":
            state.completed.register_shared(metadata)
        # The metadata goes last: only now is this part of the checkpoint restorable.
        with self.storage.create_output(f"{attempt.ctx.directory}/{metadata_name(*self._replica)}") as out:
            out.write(metadata.to_bytes())
            out.close_and_get_handle()
        done = attempt.mark_completed()
        with self._lock:
            held_version = self._held_version
            older = [
                a
                for i, a in state.attempts.items()
                if metadata.kind == "checkpoint" and i < checkpoint_id and a.kind == "checkpoint" and a.pending
            ]
        # A pending checkpoint of the live rescale is not subsumed: its move loads from it, and a
        # query's checkpoint that started after it may finish first (a small job beside a big one).
        moves = [a for a in older if held_version is not None and a.rescale_version == held_version]
        for subsumed in older:  # Flink's dropSubsumedCheckpoints
            if subsumed not in moves:
                subsumed.abort()
        held = held_version is not None and metadata.user_metadata.get("rescale_version") == held_version
        if metadata.kind == "checkpoint" and held:
            state.completed.hold(metadata.checkpoint_id)
        state.completed.add(metadata, keep_shared=bool(moves))
        if metadata.kind == "checkpoint":
            self._forget_finished_attempts(state, checkpoint_id)
        return done

    def _forget_finished_attempts(self, state: _JobCheckpoints, completed_id: int) -> None:
        """Bounded memory: finished checkpoint attempts older than the oldest retained one go
        (completed ones are still listed from storage)."""
        retained = [i for i, m in state.completed.all().items() if m.kind == "checkpoint"]
        lowest = min(retained, default=completed_id)
        with self._lock:
            for i in [i for i, a in state.attempts.items() if i < lowest and not a.pending and a.kind == "checkpoint"]:
                del state.attempts[i]

    def abort(self, job: str, checkpoint_id: int) -> CheckpointInfo:
        """notifyCheckpointAborted: stop the upload and discard what this attempt wrote."""
        state = self._state(job)
        with state.finishing:
            with self._lock:
                attempt = state.attempts.get(checkpoint_id)
            if attempt is None or attempt.status == "completed":
                if attempt is not None or state.completed.get(checkpoint_id) is not None:
                    raise CheckpointConflict(f"checkpoint {checkpoint_id} of job {job!r} is completed; it cannot abort")
                raise CheckpointNotFound(f"job {job!r} has no checkpoint {checkpoint_id}")
            attempt.abort()
        return attempt.info()

    # -- restore -------------------------------------------------------------------------------

    def restore(
        self,
        job: str,
        checkpoint_id: int | None = None,
        location: str | None = None,
        operator_parallelism: dict[str, int] | None = None,
    ) -> RestoreInfo:
        """Replace the job's state on this replica with its key groups of a completed snapshot.

        From ``location`` (a snapshot directory: a checkpoint's or savepoint's ``location``,
        within :class:`~statehouse.snapshots.storage.locations.RestoreLocations`' policy), else
        from checkpoint or savepoint ``checkpoint_id`` of this job in the configured storage,
        else from the job's latest completed checkpoint. Every replica part found is used,
        whatever replica count wrote it (rescaling). The restored job is built beside the
        live one and swapped in; on any failure the live job is as it was.
        """
        started = time.monotonic()
        if location is not None:
            storage, directory = self.locations.open(location), ""
            parts = read_parts(storage, directory)
        else:
            storage, (directory, parts) = self.storage, self.snapshots.parts(job, checkpoint_id)
        where = location or self.snapshots.location(directory)
        if not parts:
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
        first = parts[0].metadata
        restored = self.catalog.swap(job, staged, source=f"{first.kind} {first.checkpoint_id} at {where}")
        return RestoreInfo(
            job=job,
            checkpoint_id=first.checkpoint_id,
            kind=first.kind,
            format=first.format,
            location=where,
            max_parallelism=restored.max_parallelism,
            key_group_range=(restored.key_group_range.start, restored.key_group_range.end),
            parts=[part_name(p.metadata.replica_index, p.metadata.replica_count) for p in parts],
            entries_restored=operation.entries,
            bytes_read=storage.bytes_read - read_before,
            duration_ms=int((time.monotonic() - started) * 1000),
            aborted_checkpoints=aborted,
        )

    def load_key_groups(
        self, job: str, checkpoint_id: int, wanted: builtins.list[KeyGroupRange], count: int, index: int
    ) -> MergeRestore:
        """A live rescale's load on this replica: ``wanted`` (W_i minus O_i) of checkpoint
        ``checkpoint_id`` of the job into the live job, and its operator state for replica
        ``index`` of ``count`` staged (:class:`MergeRestore`); the finished operation says what it
        loaded and read. Pending checkpoints go on: they write the key groups the job owns, which
        the load does not touch."""
        directory, parts = self.snapshots.parts(job, checkpoint_id)
        if not parts:
            raise CheckpointNotFound(f"no completed snapshot part at {self.snapshots.location(directory)}")
        operation = MergeRestore(self.catalog, self.storage, job, parts, wanted, count, index, work_dir=self.work_dir)
        operation.run()
        return operation

    def _quiesce(self, job: str) -> builtins.list[int]:
        """Before replacing a job's state: abort this replica's pending checkpoints of it (they
        froze the state being replaced, so completing one later would be wrong); their ids."""
        state = self._state(job)
        with self._lock:
            pending = [a for a in state.attempts.values() if a.pending]
        with state.finishing:
            for attempt in pending:
                attempt.abort(self.complete_timeout_s)
        return sorted(a.checkpoint_id for a in pending)

    # -- shutdown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for in-flight uploads and deletes (graceful shutdown); the storage stays open. A
        base being written in the background is stopped."""
        with self._lock:
            self._closed = True
        self._cancel_seeds.set()
        self._materializer.shutdown(wait=True)
        self._runner.close()
        self._cleaner.close()

    def drain_deletes(self, timeout: float | None = None) -> bool:
        """Wait until what retention let go so far is deleted from storage (it is, in the
        background, after a completion answers); whether it is."""
        return self._cleaner.drain(timeout)
