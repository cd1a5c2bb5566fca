"""The jobs one replica serves: created, looked up, listed, deleted; reopened on restart.

A restart lists the jobs it finds but opens each on its first use: opening a RocksDB job
takes ~10 ms, so a replica with thousands of jobs is ready at once instead of after a minute.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from statehouse.backends.base.store import Store
from statehouse.backends.bounds import MAX_EPOCH
from statehouse.backends.errors import JobConflict, JobNotFound, LayoutMismatch
from statehouse.backends.job import Job, stored_descriptors
from statehouse.backends.limits import Limits
from statehouse.backends.topology import ReplicaLayout
from statehouse.backends.ttl import Clock, SystemClock
from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.keygroups import UPPER_BOUND_MAX_PARALLELISM, default_max_parallelism
from statehouse.snapshots.stored.names import validate_name

logger = logging.getLogger(__name__)


class JobCatalog:
    """The jobs this replica serves, by name, over one :class:`Store` (heap or RocksDB).

    It owns the map of names to jobs (a job found on disk is opened on first use), the replica's
    place in the topology every job it opens is given (index, count, topology version, whether
    it serves), and the persisted layout that records each job's key-group range. It is where a
    job is created, looked up, deleted and closed, and where a restore builds a job beside the
    live one and swaps it in (:meth:`stage`, :meth:`swap`). One lock orders opening, creation,
    deletion and swaps; a lookup of an open job takes none."""

    def __init__(
        self,
        store: Store,
        *,
        replica_index: int = 0,
        replica_count: int = 1,
        clock: Clock | None = None,
        limits: Limits | None = None,
        layout: ReplicaLayout | None = None,
    ) -> None:
        if replica_count < 1 or replica_index < 0:
            raise ValueError(f"replica index {replica_index} must be >= 0, replica count {replica_count} >= 1")
        self.store = store
        self.replica_index = replica_index
        self.replica_count = replica_count
        self.clock: Clock = clock or SystemClock()
        self.limits = limits or Limits()
        # False on a replica joining a live rescale (its jobs hold key groups loaded for the move
        # and own none until the move commits: switch_layout), and on one a move removed (its
        # index past the count: it owns nothing, and says who does).
        self.serving = replica_index < replica_count
        # What a pending live rescale does to every job opened, created or swapped in from now
        # on (freeze what it moves out): set and cleared by backends/checkpointing/rescale.py.
        self.on_open: Callable[[Job], None] | None = None
        # None: a job found on disk at start, not opened yet (see _open).
        self._jobs: dict[str, Job | None] = dict.fromkeys(store.existing())
        self._lock = threading.Lock()
        # The persisted topology (None in unit tests): each job's key-group range is recorded
        # with its data, and a job whose data holds another range than the topology gives it
        # (after an adopted rescale) is refused until a restore replaces it.
        self.layout = layout
        self.layout_version = 0
        if layout is not None:
            if (layout.topology.count, layout.topology.index) != (replica_count, replica_index):
                raise ValueError("the layout's replica count and index differ from the catalog's")
            layout.keep_only(list(self._jobs))
            self.layout_version = layout.topology.version

    def _open(self, name: str) -> Job | None:
        """The job of that name, opened if it is not yet; None if there is none (hold the lock)."""
        job = self._jobs.get(name)
        if job is None and name in self._jobs:
            job = self._jobs[name] = self._opened(self._job(name, self.store.open_partition(name, None)))
            if self.layout is not None and name not in self.layout.topology.jobs:
                self.layout.record(name, job.max_parallelism)  # written before ranges were recorded
        return job

    def _opened(self, job: Job) -> Job:
        if self.on_open is not None:
            self.on_open(job)
        return job

    def _job(self, name: str, partition, serving: bool | None = None) -> Job:
        return Job(
            name,
            partition,
            replica_index=self.replica_index,
            replica_count=self.replica_count,
            clock=self.clock,
            limits=self.limits,
            layout_version=self.layout_version,
            serving=self.serving if serving is None else serving,
        )

    def switch_layout(self, count: int, index: int, version: int) -> None:
        """Serve replica ``index`` of ``count`` at topology ``version`` from now on: every job (open
        or opened later) owns that layout's key groups (``Job.switch_layout``); none when the
        move removed this replica (``index >= count``)."""
        with self._lock:
            self.replica_count, self.replica_index, self.layout_version = count, index, version
            self.serving = index < count
            for job in self._jobs.values():
                if job is not None:
                    job.switch_layout(count, index, version)

    def _check_layout(self, name: str) -> None:
        mismatched = self.layout.topology.mismatched(name) if self.layout is not None else None
        if mismatched is not None:
            topology = self.layout.topology  # type: ignore[union-attr]
            expected = topology.expected(mismatched.max_parallelism)
            raise LayoutMismatch(
                f"job {name!r} on this replica holds key groups {mismatched.start}-{mismatched.end}, written "
                f"under another replica count; replica {topology.index} of {topology.count} (topology version "
                f"{topology.version}) owns {expected.start}-{expected.end}: restore the job from a savepoint "
                f"(POST /v1/jobs/{name}/restore) or delete it",
                version=topology.version,
            )

    def create(self, name: str, max_parallelism: int | None = None, *, serving: bool | None = None) -> tuple[Job, bool]:
        """Create a job or confirm an existing one; ``(job, created)``.

        Without ``max_parallelism`` a new job gets Flink's default for the replica count.
        A different max parallelism for an existing job is refused: key groups are fixed
        for the life of the state. ``serving=False``: a new job owns no key group yet (a live
        rescale loads one on a new replica; see :attr:`serving`).
        """
        validate_name(name, "job")
        if max_parallelism is not None:
            if isinstance(max_parallelism, bool) or not isinstance(max_parallelism, int):
                raise InvalidArgument("max_parallelism must be an integer")
            if not self.replica_count <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
                raise InvalidArgument(
                    f"max_parallelism must be in [{self.replica_count} (the replica count), "
                    f"{UPPER_BOUND_MAX_PARALLELISM}]; got {max_parallelism}"
                )
        with self._lock:
            job = self._open(name)
            if job is not None:
                if self.layout_version > 1:  # an existing job of the old layout is refused, as by get()
                    self._check_layout(name)
                if max_parallelism is not None and max_parallelism != job.max_parallelism:
                    raise JobConflict(
                        f"job {name!r} exists with max_parallelism {job.max_parallelism}; it cannot change "
                        f"to {max_parallelism} (restore a savepoint into a new job instead)"
                    )
                return job, False
            self.limits.check_jobs(len(self._jobs))
            partition = self.store.open_partition(name, max_parallelism or default_max_parallelism(self.replica_count))
            job = self._jobs[name] = self._opened(self._job(name, partition, serving))
            if self.layout is not None:
                self.layout.record(name, job.max_parallelism)
            return job, True

    def get(self, name: str, *, serving: bool = True) -> Job:
        """The job; ``serving=False`` also returns a job refused for its layout (to list or delete it)."""
        job = self._jobs.get(name)
        if job is None:
            if name in self._jobs:
                with self._lock:
                    job = self._open(name)
            if job is None:
                validate_name(name, "job")
                raise JobNotFound(f"no job {name!r}; create it with PUT /v1/jobs/{name}")
        if serving and self.layout_version > 1:  # only an adopted topology leaves jobs of another range
            self._check_layout(name)
        return job

    def __len__(self) -> int:
        return len(self._jobs)

    def names(self) -> list[str]:
        return sorted(self._jobs)

    def delete(self, name: str) -> None:
        with self._lock:
            if name not in self._jobs:
                self.get(name, serving=False)  # raises job_not_found
            job = self._jobs.pop(name)
            if job is not None:
                job.close()
            self.store.destroy_partition(name)
            if self.layout is not None:
                self.layout.forget(name)

    # -- restore: build beside, verify, swap ----------------------------------------------

    def stage(self, name: str, max_parallelism: int) -> Job:
        """A new, empty job beside the live one (if any), for a restore to fill; the live job
        keeps serving. Pass it to :meth:`swap`, or to :meth:`discard` on failure."""
        validate_name(name, "job")
        if name not in self._jobs:
            self.limits.check_jobs(len(self._jobs))  # before the download, not after
        return self._job(name, self.store.open_staging(name, max_parallelism))

    def swap(self, name: str, staged: Job, source: str = "a staged restore") -> Job:
        """Put a staged job in place of the live one, atomically for every request (``source``:
        what it was restored from, for the log).

        The live job is retired first (a write in progress finishes, later ones get
        ``not_ready`` and retry on the new job). The new job's writer epoch is one past the live
        job's: writers of the running epoch wrote against the replaced state (their staged
        writes are gone with it), so they are fenced off. If the swap fails, the live job is as
        it was and serves again; the staged one is discarded.
        """
        with self._lock:
            live = self._open(name)
            if live is not None:
                live.retire()
            try:
                if live is None:
                    self.limits.check_jobs(len(self._jobs))
                # A savepoint holds as many states as it holds: the limit applies to it too.
                self.limits.check_states(name, len(stored_descriptors(staged.partition)))
                # At the largest epoch none is past it: the restored job keeps it (what was staged
                # under it is gone with the old job all the same).
                staged.fence(min(live.epoch + 1, MAX_EPOCH) if live is not None else 0)
                partition = self.store.promote(name, live.partition if live is not None else None, staged.partition)
            except BaseException:
                self.store.discard_staging(name, staged.partition)
                if live is not None:
                    live.revive()
                raise
            job = self._jobs[name] = self._opened(self._job(name, partition))
            if self.layout is not None:
                self.layout.record(name, job.max_parallelism)  # the restore wrote this topology's range
        logger.info(
            "restore swapped in job %s from %s: key groups %d-%d of max parallelism %d, %s, writer epoch %d",
            name,
            source,
            job.key_group_range.start,
            job.key_group_range.end,
            job.max_parallelism,
            "replacing the live job" if live is not None else "a new job",
            job.epoch,
        )
        return job

    def discard(self, staged: Job) -> None:
        self.store.discard_staging(staged.name, staged.partition)

    def close(self) -> None:
        with self._lock:
            for job in self._jobs.values():
                if job is not None:
                    job.close()
            self._jobs.clear()
