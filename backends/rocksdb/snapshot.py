"""RocksDB's own snapshotting: incremental checkpoints of its SST files, and reading them back.

Flink's ``RocksIncrementalSnapshotStrategy``: the synchronous part takes a native checkpoint
(hard links to the immutable SST files); the asynchronous part uploads the SST files the
previous completed checkpoint of the same database did not have (shared, by reference from
then on; the options file too) and the few other files (private). Savepoints and full checkpoints use the canonical
strategy (``statehouse.backends.snapshot.full_strategy``).

A restore reads an incremental part (:class:`IncrementalPartRestore`) by opening its downloaded
files as a read-only database and copying the wanted key groups out (Flink's "copy" restore
path): correct for any rescale and for either target backend. The handle records each table
file's key groups, so a restore of some key groups downloads only the files that can hold them
(plus the small private ones); files flushed from memtables (level 0) usually span every key
group and are always among them. The reading is the shared reader's
(:mod:`statehouse.snapshots.incremental`), which the Spark data source uses too.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator

from statehouse.backends.base.partition import Guard, StorePartition, WriteOp, load_records
from statehouse.backends.base.snapshot import PartReader, SnapshotSource
from statehouse.backends.reserved import keyed_tables
from statehouse.backends.rocksdb.partition import RocksDBPartition
from statehouse.backends.snapshot.full_strategy import JobStrategy, descriptor_dicts, write_operator_state
from statehouse.backends.snapshot.operator_format import OperatorSnapshot
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.handles import IncrementalHandle, StreamHandle
from statehouse.snapshots.incremental import IncrementalPartReader
from statehouse.snapshots.layout import shared_dir
from statehouse.snapshots.metadata import SnapshotFormat, SnapshotPart
from statehouse.snapshots.storage.base import CheckpointStorage
from statehouse.snapshots.strategy import AsyncSnapshot, Seed, SeedContext, SnapshotContext, SnapshotResult


def reusable_files(previous: SnapshotPart | None, backend_uid: str) -> dict[str, StreamHandle]:
    """Flink's ``uploadedSstFiles``: the shared files of the previous completed checkpoint
    (root-relative), if it was taken of this same database. It is durable and registered, and
    retention never deletes the latest checkpoint."""
    if previous is None:
        return {}
    keyed = previous.metadata.keyed
    if not isinstance(keyed, IncrementalHandle) or keyed.backend_uid != backend_uid:
        return {}
    return {name: handle.under(previous.directory) for name, handle in keyed.shared.items()}


def _immutable(name: str) -> bool:
    """Whether a file of a native checkpoint never changes under its name, so that a later
    checkpoint of the same database may reuse it (shared): a table file, and the options file
    (RocksDB writes a new one, under a new number, whenever the options change: ~26 KB, and on
    S3 a request, that every checkpoint uploaded again)."""
    return name.endswith(".sst") or name.startswith("OPTIONS-")


def _shared_targets(job: str, names: list[str]) -> dict[str, str]:
    """Where each of these files of ``job`` goes as a shared file: a unique name per upload (Flink's
    physical id), so that an aborted attempt's file can be deleted without touching another
    attempt's copy of the same SST."""
    shared = shared_dir(job)
    return {n: f"{shared}/{uuid.uuid4().hex}-{n}" for n in names}


# The size of the table files a live rescale's checkpoint compacts the moving key groups into: a
# load downloads the files overlapping its share, so at most about two such files more than it.
MOVE_FILE_BYTES = 4 << 20


class IncrementalSnapshotStrategy(JobStrategy):
    """Flink's ``RocksIncrementalSnapshotStrategy`` over a job's RocksDB partition: a native
    checkpoint, then the SST files the previous checkpoint of the same database lacks."""

    format: SnapshotFormat = "incremental"

    def __init__(self, move_file_bytes: int | None = None) -> None:
        self.move_file_bytes = move_file_bytes  # None: no compaction before a move's checkpoint

    def settle(self, job: SnapshotSource) -> None:
        """A checkpoint of a job a live rescale froze is the one the move's loads read: compact
        the key groups moving out into files of about ``move_file_bytes`` first, so that no
        file of them spans key groups that stay (table files flushed from memtables, level 0,
        span every key group, and the load would download them whole). Frozen key groups do
        not change, so the files stay as compacted; writes to the others go on meanwhile."""
        frozen = job.keyspace.frozen
        if self.move_file_bytes is None or not frozen:
            return
        partition = job.partition
        assert isinstance(partition, RocksDBPartition), "the RocksDB store only opens RocksDB partitions"
        partition.flush()
        partition.compact_key_groups(list(keyed_tables(partition.tables())), frozen, self.move_file_bytes)

    def seed(self, job: SnapshotSource, ctx: SeedContext) -> Seed | None:
        """The database's table files that ``previous`` lacks, uploaded now under fresh names (a
        joining replica's, after its copy's load: off the query's path, so that the query's first
        checkpoint on the new layout uploads only what changed since)."""
        partition = job.partition
        assert isinstance(partition, RocksDBPartition), "the RocksDB store only opens RocksDB partitions"
        partition.flush()
        with job.exclusive():
            view = partition.freeze()
        try:
            backend_uid = partition.identity()
            reusable = reusable_files(ctx.previous, backend_uid)
            names = [n for n in sorted(os.listdir(view.path)) if _immutable(n) and n not in reusable]
            targets = _shared_targets(ctx.name, names)
            storage = ctx.storage
            uploads = storage.transfer(lambda n: storage.put_file(targets[n], os.path.join(view.path, n)), names)
            return Seed(backend_uid, dict(zip(names, uploads, strict=True)))
        finally:
            view.release()

    def prepare(self, job: SnapshotSource, ctx: SnapshotContext) -> AsyncSnapshot:
        partition = job.partition
        assert isinstance(partition, RocksDBPartition), "the RocksDB store only opens RocksDB partitions"
        view = partition.freeze()
        states = descriptor_dicts(job)
        tables = keyed_tables(view.tables())
        backend_uid = partition.identity()
        reusable = reusable_files(ctx.previous, backend_uid)
        if ctx.seed is not None and ctx.seed.backend_uid == backend_uid:
            reusable = {**ctx.seed.files, **reusable}
        names = sorted(os.listdir(view.path))
        shared_names = [n for n in names if _immutable(n)]
        placeholders = {n: reusable[n] for n in shared_names if n in reusable}
        private_names = [n for n in names if not _immutable(n)]
        # Read from the live database now, while the job's writes are held off: what the
        # checkpoint holds, without opening it as a database (a read-only open of every column
        # family, ~8 ms of CPU each checkpoint: bench/replica.py).
        operator_state = OperatorSnapshot.from_view(partition)
        spans = {n: span for n, span in partition.file_spans(tables).items() if n in shared_names}

        def body() -> SnapshotResult:
            targets = _shared_targets(ctx.job, [n for n in shared_names if n not in placeholders])
            targets.update({n: ctx.part_path(f"db/{n}") for n in private_names})
            names = list(targets)

            def upload(name: str | None) -> StreamHandle:
                ctx.check_cancelled()
                if name is None:  # the operator state goes up beside the files, not after them
                    return write_operator_state(ctx, operator_state)
                ctx.written.append(targets[name])
                return ctx.storage.put_file(targets[name], os.path.join(view.path, name))

            *files, operator = ctx.storage.transfer(upload, [*names, None])
            handles: dict[str, StreamHandle] = dict(zip(names, files, strict=True))
            uploaded = {n: handles[n] for n in shared_names if n in handles}
            private = {n: handles[n] for n in private_names}
            keyed = IncrementalHandle(
                backend_uid,
                job.key_group_range,
                ctx.checkpoint_id,
                {n: h.relative_to(ctx.directory) for n, h in {**placeholders, **uploaded}.items()},
                {n: h.relative_to(ctx.directory) for n, h in private.items()},
                tables,
                spans,
            )
            return SnapshotResult(
                "incremental",
                keyed,
                operator.relative_to(ctx.directory),
                states,
                job.max_parallelism,
                sum(h.size for h in (*uploaded.values(), *private.values(), operator)),
                sum(h.size for h in placeholders.values()),
            )

        return AsyncSnapshot(view, body)


class FetchedIncremental:
    """Some key groups of an incremental part, downloaded into a directory of their own and
    opened read-only by the shared reader (:class:`~statehouse.snapshots.incremental.IncrementalPartReader`)."""

    def __init__(self, reader: IncrementalPartReader) -> None:
        self.reader = reader

    def tables(self) -> dict[str, bool]:
        return self.reader.tables()

    def records(self) -> Iterator[WriteOp]:
        with self.reader:  # open while its records are read
            for table in self.reader.tables():
                for kg, primary, secondary, value in self.reader.records(table):
                    yield WriteOp("put", table, kg, primary, secondary, value)

    def load_into(self, partition: StorePartition, guard: Guard) -> int:
        """Into a RocksDB partition of the same max parallelism (the same key layout), each
        table's entries go as they are stored, written into one table file and ingested under the
        guard; into any other, as writes."""
        if not isinstance(partition, RocksDBPartition) or partition.max_parallelism != self.reader.max_parallelism:
            return load_records(partition, self.records(), guard)
        loaded = 0
        with self.reader:
            for table in self.reader.tables():
                path = os.path.join(self.reader.directory, f"load-{uuid.uuid4().hex}.sst")
                count = partition.write_table_file(path, self.reader.entries(table))
                if count:
                    partition.ingest_table_file(table, path, self.reader.wanted, guard)
                loaded += count
        return loaded

    def release(self) -> None:
        self.reader.close()
        shutil.rmtree(self.reader.directory, ignore_errors=True)


class IncrementalPartRestore(PartReader):
    """RocksDB's restore of an incremental part (Flink's "copy" restore path, into either
    backend): the files that can hold the wanted key groups, downloaded to disk, their entries
    copied out. A part's files are on disk, not in memory: one chunk, whatever its size."""

    def chunks(self, part: SnapshotPart, wanted: KeyGroupRange, max_bytes: int) -> list[KeyGroupRange]:
        share = part.metadata.key_group_range.intersection(wanted)
        return [share] if len(share) else []

    def fetch(
        self, storage: CheckpointStorage, part: SnapshotPart, wanted: KeyGroupRange, work_dir: str
    ) -> FetchedIncremental:
        directory = tempfile.mkdtemp(prefix="part-", dir=work_dir)
        try:
            return FetchedIncremental(IncrementalPartReader.download(storage, part, wanted, directory))
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise


INCREMENTAL_RESTORE = IncrementalPartRestore()
