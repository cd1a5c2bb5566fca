"""Restore: one replica's key-group range from one or many snapshot parts (Flink's
``StateAssignmentOperation`` + the backends' restore operations).

Every part whose key-group range intersects the replica's range contributes, read by its
format's reader (:func:`~statehouse.backends.snapshot.restore.part_reader`, the backends'): a
full part through a ranged read of just those key groups, an incremental part by downloading
the RocksDB files whose key groups overlap them, which the shared reader copies the owned key
groups out of. Everything is fetched and verified, then bulk-loaded into a new partition beside
the live job (the store builds it); the caller swaps it in. A corrupt or missing file, or any
other failure, leaves the live job as it was.
"""

from __future__ import annotations

import errno
import gc
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from statehouse.backends.base.snapshot import FetchedPart
from statehouse.backends.catalog import JobCatalog
from statehouse.backends.errors import InsufficientStorage
from statehouse.backends.job import Job, stored_descriptors
from statehouse.backends.snapshot.operator_format import OperatorSnapshot, merge_for_replica, write_ops
from statehouse.backends.snapshot.restore import part_reader
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.errors import RestoreIncompatible, RestoreIncomplete, SnapshotCorrupt
from statehouse.snapshots.metadata import SnapshotPart
from statehouse.snapshots.storage.base import CheckpointStorage
from statehouse.snapshots.stored.descriptors import StateDescriptor

# A restore stages what it fetches in a directory named so (in the work directory) and removes it
# when it ends; one a killed process left is removed at the next start (remove_leftovers).
STAGING_PREFIX = "statehouse-restore-"


def target_range(parts: list[SnapshotPart], replica_index: int, replica_count: int) -> KeyGroupRange:
    """This replica's key groups for the snapshot's max parallelism; checks the parts fit."""
    if not parts:
        raise RestoreIncomplete("the snapshot has no completed parts")
    max_parallelisms = {p.metadata.max_parallelism for p in parts}
    if len(max_parallelisms) != 1:
        raise SnapshotCorrupt(f"the snapshot's parts disagree on max_parallelism: {sorted(max_parallelisms)}")
    max_parallelism = max_parallelisms.pop()
    if replica_count > max_parallelism:
        raise RestoreIncompatible(
            f"the snapshot has max_parallelism {max_parallelism}; it cannot be spread over {replica_count} replicas"
        )
    return KeyGroupRange.for_operator(max_parallelism, replica_count, replica_index)


def check_coverage(parts: list[SnapshotPart], target: KeyGroupRange) -> list[SnapshotPart]:
    """The parts intersecting ``target``; refuses gaps and overlaps inside it."""
    relevant = sorted(
        (p for p in parts if len(p.metadata.key_group_range.intersection(target))),
        key=lambda p: p.metadata.key_group_range.start,
    )
    next_needed = target.start
    previous_end: int | None = None
    for part in relevant:
        kg_range = part.metadata.key_group_range
        if previous_end is not None and kg_range.start <= previous_end:
            raise SnapshotCorrupt(
                f"snapshot parts overlap at key group {kg_range.start} "
                f"(replica {part.metadata.replica_index} of {part.metadata.replica_count})"
            )
        if kg_range.start > next_needed:
            break
        next_needed = kg_range.end + 1
        previous_end = kg_range.end
    if next_needed <= target.end:
        found = ", ".join(
            f"replica-{p.metadata.replica_index}-of-{p.metadata.replica_count} "
            f"{p.metadata.key_group_range.start}-{p.metadata.key_group_range.end}"
            for p in parts
        )
        raise RestoreIncomplete(
            f"the snapshot's parts do not cover key groups {next_needed}-{target.end} of this replica's range "
            f"{target.start}-{target.end} (parts found: {found or 'none'}); wait until every replica has "
            "completed it, or restore another checkpoint"
        )
    return relevant


class RestoreOperation:
    """Restores one job on one replica from the parts of one snapshot: fetches and verifies the
    replica's key groups of every part (each by its format's reader) and the operator state
    merged for the replica, then builds the restored job beside the live one, for the catalog
    to swap in. ``entries`` counts what was loaded."""

    def __init__(
        self,
        catalog: JobCatalog,
        storage: CheckpointStorage,
        job: str,
        parts: list[SnapshotPart],
        *,
        operator_parallelism: dict[str, int] | None = None,
        work_dir: str | None = None,
    ) -> None:
        self.catalog = catalog
        self.storage = storage
        self.job_name = job
        self.parts = parts
        self.operator_parallelism = operator_parallelism
        self.work_dir = work_dir
        self.entries = 0
        # The key groups whose records were fetched (a full part's sections; what is copied out
        # of an incremental part's files): a live rescale's loads are held to what moves in.
        self.key_groups_fetched: set[int] = set()

    def run(self) -> Job:
        """Fetch and verify every byte, then build the restored job beside the live one.

        Returns the staged job, for ``JobCatalog.swap`` (or ``discard``); the live job is
        untouched either way."""
        target = target_range(self.parts, self.catalog.replica_index, self.catalog.replica_count)
        with self._staging() as temp:
            fetched: list[FetchedPart] = []
            try:
                for part in check_coverage(self.parts, target):
                    fetched.append(self._fetch(part, target, temp))
                operator = self._operator(self.catalog.replica_index, self.catalog.replica_count)
                return self._apply(fetched, operator)
            finally:
                for item in fetched:
                    item.release()

    @contextmanager
    def _staging(self) -> Iterator[str]:
        """A directory for what is fetched, removed when the restore ends; running out of space
        anywhere inside is a 507 that says what to do."""
        try:
            temp = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.work_dir)
        except OSError as exc:
            raise _insufficient(exc) if _out_of_space(exc) else exc from None
        try:
            yield temp
        except OSError as exc:
            if _out_of_space(exc):
                raise _insufficient(exc) from exc
            raise
        finally:
            # The young generations only: they hold what the fetches left in cycles. A full
            # collection walks every object a heap backend's state is made of (~0.5 s per million
            # keys), inside a move's frozen window at its cut.
            gc.collect(1)
            shutil.rmtree(temp, ignore_errors=True)

    def _operator(self, replica_index: int, replica_count: int) -> OperatorSnapshot:
        """The operator state replica ``replica_index`` of ``replica_count`` gets from every part."""
        operator_parts = [
            OperatorSnapshot.from_bytes(self.storage.read_verified(p.metadata.operator.under(p.directory)))
            for p in sorted(self.parts, key=lambda p: p.metadata.replica_index)
        ]
        return merge_for_replica(operator_parts, replica_index, replica_count, self.operator_parallelism)

    # -- fetch: storage -> verified local bytes --------------------------------------------

    def _fetch(self, part: SnapshotPart, target: KeyGroupRange, temp: str) -> FetchedPart:
        wanted = part.metadata.key_group_range.intersection(target)
        self.key_groups_fetched.update(wanted)
        return part_reader(part).fetch(self.storage, part, wanted, temp)

    # -- build: a new job beside the live one -------------------------------------------------

    def _apply(self, fetched: list[FetchedPart], operator: OperatorSnapshot) -> Job:
        job = self.catalog.stage(self.job_name, self.parts[0].metadata.max_parallelism)
        try:
            self._build(job, fetched, operator)
        except BaseException:
            self.catalog.discard(job)
            raise
        return job

    def _build(self, job: Job, fetched: list[FetchedPart], operator: OperatorSnapshot) -> None:
        descriptors = _descriptors(self.parts)
        for state in descriptors:
            job.register_state(state)
        _create_tables(job, fetched)
        for item in fetched:
            self.entries += item.load_into(job.partition, nullcontext)
        self.entries += job.partition.load(write_ops(operator))
        with job.transaction() as tx:  # the micro-batches the restored state holds
            tx.record_commit(*_committed(self.parts))
        # Verify what the swapped-in job will serve: the states as stored, after every write.
        if stored_descriptors(job.partition) != {d.name: d for d in descriptors}:
            raise SnapshotCorrupt("the restored job's stored states differ from the snapshot's")


def _create_tables(job: Job, fetched: list[FetchedPart]) -> None:
    """The tables the fetched parts hold records of (a no-op for registered states)."""
    for item in fetched:
        for table, nested in item.tables().items():
            job.partition.create_table(table, nested)


class MergeRestore(RestoreOperation):
    """A live rescale's load: the key groups ``wanted`` (what moves in to replica ``index`` of
    ``count``: W_i minus O_i) from a snapshot's parts, INTO the live job (created, owning no key
    group, on a replica that has none), beside what it serves. Whatever a previous partial load
    left in those key groups is cleared first, so a load can be re-run after any failure. They
    are not served until the job switches to the new layout (``Job.switch_layout``). The job's
    operator state for the new layout is staged, applied by ``Job.apply_staged_operator_state``
    when the move commits.

    Fetching is the restore's (ranged reads of only those key groups of full parts, incremental
    parts' files holding those key groups copied out of by RocksDB's reader), a chunk of key groups at a time: each is
    verified before it is loaded, and memory holds one chunk (``LOAD_FETCH_BYTES``). ``entries``
    and ``bytes_read`` (from storage, during :meth:`run`) say what was loaded and what it cost."""

    def __init__(
        self,
        catalog: JobCatalog,
        storage: CheckpointStorage,
        job: str,
        parts: list[SnapshotPart],
        wanted: list[KeyGroupRange],
        count: int,
        index: int,
        *,
        operator_parallelism: dict[str, int] | None = None,
        work_dir: str | None = None,
    ) -> None:
        super().__init__(catalog, storage, job, parts, operator_parallelism=operator_parallelism, work_dir=work_dir)
        self.wanted = [r for r in wanted if len(r)]
        self.count = count
        self.index = index
        self.bytes_read = 0

    def run(self) -> Job:
        """Load the wanted key groups and stage the operator state; the live job (returned)."""
        target_range(self.parts, self.index, self.count)  # the parts agree; the count fits them
        plan = [
            (part, chunk)
            for target in self.wanted
            for part in check_coverage(self.parts, target)
            for chunk in part_reader(part).chunks(part, target, LOAD_FETCH_BYTES)
        ]  # refuses a snapshot that does not cover them first
        read_before = self.storage.bytes_read
        try:
            with self._staging() as temp:
                operator = self._operator(self.index, self.count)
                job, _created = self.catalog.create(
                    self.job_name, self.parts[0].metadata.max_parallelism, serving=False
                )
                self.clear(job)
                for descriptor in _descriptors(self.parts):
                    job.register_state(descriptor, loading=True)
                # A chunk at a time, fetched (verified) then loaded: what it holds in memory is one
                # chunk, whatever the share (a failure leaves key groups nobody serves; a re-run
                # clears them).
                for part, chunk in plan:
                    item = self._fetch(part, chunk, temp)
                    try:
                        _create_tables(job, [item])
                        self.entries += item.load_into(job.partition, job.exclusive)
                    finally:
                        item.release()
                epoch, batch = _committed(self.parts)
                if job.committed_epoch < epoch:  # a new job: the micro-batches the loaded state holds
                    with job.transaction() as tx:
                        tx.record_commit(epoch, batch)
                job.stage_operator_state(operator)
                return job
        finally:
            self.bytes_read = self.storage.bytes_read - read_before

    def clear(self, job: Job | None = None) -> None:
        """Remove what a load left (its key groups, its staged operator state): before a load,
        and when the move is aborted."""
        job = job if job is not None else self.catalog.get(self.job_name, serving=False)
        job.drop_key_groups(self.wanted)
        job.stage_operator_state(None)


# Bytes of a full part's key-group sections a load fetches at once (one key group larger than
# this is fetched alone): bounds what a load holds in memory on a replica that keeps serving.
LOAD_FETCH_BYTES = 32 << 20


def _out_of_space(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _insufficient(exc: OSError) -> InsufficientStorage:
    return InsufficientStorage(
        f"the restore's staging copy does not fit on the data volume ({exc}); the job is as it was. "
        "Free space (a restore needs room for one more copy of the replica's state) and retry"
    )


def remove_leftovers(work_dir: str, prefixes: tuple[str, ...] = (STAGING_PREFIX,)) -> list[str]:
    """Remove the directories a killed process left in ``work_dir``: a restore's staging copies
    (each a copy of a replica's snapshot), and those of the other ``prefixes`` given; nothing
    else. Call it before anything can write there. Returns the names removed."""
    removed = []
    for name in sorted(os.listdir(work_dir)):
        path = os.path.join(work_dir, name)
        if name.startswith(prefixes) and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
    return removed


def _descriptors(parts: list[SnapshotPart]) -> list[StateDescriptor]:
    seen: dict[str, StateDescriptor] = {}
    for part in parts:
        for data in part.metadata.states:
            descriptor = StateDescriptor.from_dict(data)
            seen.setdefault(descriptor.name, descriptor)
    return [seen[name] for name in sorted(seen)]


def _committed(parts: list[SnapshotPart]) -> tuple[int, int | None]:
    """The committed epoch and micro-batch the parts' state holds: the newest part's (every part
    of one checkpoint holds the same, unless a commit was half done when it was taken)."""
    newest = max(parts, key=lambda p: p.metadata.committed_epoch)
    return newest.metadata.committed_epoch, newest.metadata.committed_batch
