"""Restore: one replica's key-group range from one or many snapshot parts (Flink's
``StateAssignmentOperation`` + the backends' restore operations).

Every part whose key-group range intersects the replica's range contributes: a full part
through a ranged read of just those key groups, an incremental part by downloading its
RocksDB files, which RocksDB's own reader copies the owned key groups out of. Everything is
fetched and verified, then bulk-loaded into a new partition beside the live job (the store
builds it); the caller swaps it in. A corrupt or missing file, or any other failure, leaves
the live job as it was.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from statehouse.backends.base.partition import WriteOp
from statehouse.backends.catalog import JobCatalog
from statehouse.backends.descriptors import StateDescriptor
from statehouse.backends.errors import InsufficientStorage
from statehouse.backends.job import Job, stored_descriptors
from statehouse.backends.rocksdb.snapshot import incremental_records
from statehouse.backends.rocksdb.space import is_out_of_space
from statehouse.backends.snapshot.full_format import FetchedKeyGroups, fetch_key_groups
from statehouse.backends.snapshot.operator_format import OperatorSnapshot, merge_for_replica, write_ops
from statehouse.keygroups import KeyGroupRange
from statehouse.snapshots.errors import RestoreIncompatible, RestoreIncomplete, SnapshotCorrupt
from statehouse.snapshots.handles import IncrementalHandle, KeyGroupsHandle
from statehouse.snapshots.metadata import SnapshotPart
from statehouse.snapshots.storage.base import CheckpointStorage

# A restore stages what it fetches in a directory named so (in the work directory) and removes it
# when it ends; one a killed process left is removed at the next start (remove_leftovers).
STAGING_PREFIX = "statehouse-restore-"


@dataclass
class _FetchedPart:
    part: SnapshotPart
    wanted: KeyGroupRange
    full: FetchedKeyGroups | None = None
    db_dir: str | None = None


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
    """Restores one job on one replica from the parts of one snapshot."""

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

    def run(self) -> Job:
        """Fetch and verify every byte, then build the restored job beside the live one.

        Returns the staged job, for ``JobCatalog.swap`` (or ``discard``); the live job is
        untouched either way."""
        target = target_range(self.parts, self.catalog.replica_index, self.catalog.replica_count)
        relevant = check_coverage(self.parts, target)
        try:
            temp = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.work_dir)
        except OSError as exc:
            raise _insufficient(exc) if is_out_of_space(exc) else exc from None
        try:
            fetched = [self._fetch(part, target, temp) for part in relevant]
            operator_parts = [
                OperatorSnapshot.from_bytes(self.storage.read_verified(p.metadata.operator.under(p.directory)))
                for p in sorted(self.parts, key=lambda p: p.metadata.replica_index)
            ]
            operator = merge_for_replica(
                operator_parts, self.catalog.replica_index, self.catalog.replica_count, self.operator_parallelism
            )
            return self._apply(fetched, operator, temp)
        except OSError as exc:
            if is_out_of_space(exc):
                raise _insufficient(exc) from exc
            raise
        finally:
            gc.collect()
            shutil.rmtree(temp, ignore_errors=True)

    # -- fetch: storage -> verified local bytes --------------------------------------------

    def _fetch(self, part: SnapshotPart, target: KeyGroupRange, temp: str) -> _FetchedPart:
        keyed = part.metadata.keyed
        wanted = part.metadata.key_group_range.intersection(target)
        if isinstance(keyed, KeyGroupsHandle):
            handle = KeyGroupsHandle(keyed.stream.under(part.directory), keyed.header, keyed.offsets)
            return _FetchedPart(part, wanted, full=fetch_key_groups(self.storage, handle, wanted))
        assert isinstance(keyed, IncrementalHandle)
        db_dir = tempfile.mkdtemp(prefix="part-", dir=temp)
        for name, file in {**keyed.shared, **keyed.private}.items():
            self.storage.download_verified(file.under(part.directory), os.path.join(db_dir, name))
        return _FetchedPart(part, wanted, db_dir=db_dir)

    # -- build: a new job beside the live one -------------------------------------------------

    def _apply(self, fetched: list[_FetchedPart], operator: OperatorSnapshot, temp: str) -> Job:
        job = self.catalog.stage(self.job_name, self.parts[0].metadata.max_parallelism)
        try:
            self._build(job, fetched, operator, temp)
        except BaseException:
            self.catalog.discard(job)
            raise
        return job

    def _build(self, job: Job, fetched: list[_FetchedPart], operator: OperatorSnapshot, temp: str) -> None:
        descriptors = _descriptors(self.parts)
        for state in descriptors:
            job.register_state(state)
        for item in fetched:
            if item.full is not None:
                tables = item.full.header.tables
            else:
                assert isinstance(item.part.metadata.keyed, IncrementalHandle)
                tables = item.part.metadata.keyed.tables
            for table, nested in tables.items():
                job.partition.create_table(table, nested)  # a no-op for registered states
        for item in fetched:
            self.entries += job.partition.load(self._records(item, temp))
        self.entries += job.partition.load(write_ops(operator))
        with job.transaction() as tx:  # the micro-batches the restored state holds
            tx.record_commit(max(p.metadata.committed_epoch for p in self.parts))
        # Verify what the swapped-in job will serve: the states as stored, after every write.
        if stored_descriptors(job.partition) != {d.name: d for d in descriptors}:
            raise SnapshotCorrupt("the restored job's stored states differ from the snapshot's")

    def _records(self, item: _FetchedPart, temp: str) -> Iterator[WriteOp]:
        if item.full is not None:
            for kg, table, primary, secondary, value in item.full.records():
                yield WriteOp("put", table, kg, primary, secondary, value)
            return
        assert item.db_dir is not None
        keyed = item.part.metadata.keyed
        assert isinstance(keyed, IncrementalHandle)
        yield from incremental_records(item.db_dir, keyed, item.wanted, item.part.metadata.max_parallelism, temp)


def _insufficient(exc: OSError) -> InsufficientStorage:
    return InsufficientStorage(
        f"the restore's staging copy does not fit on the data volume ({exc}); the job is as it was. "
        "Free space (a restore needs room for one more copy of the replica's state) and retry"
    )


def remove_leftovers(work_dir: str) -> list[str]:
    """Remove the staging directories of restores a killed process left in ``work_dir`` (each a
    copy of a replica's snapshot); only directories of this module's name pattern, nothing else.
    Call it before any restore can run. Returns the names removed."""
    removed = []
    for name in sorted(os.listdir(work_dir)):
        path = os.path.join(work_dir, name)
        if name.startswith(STAGING_PREFIX) and os.path.isdir(path) and not os.path.islink(path):
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
