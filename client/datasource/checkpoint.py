"""``option("checkpoint", N)``: state read from a completed checkpoint or savepoint in checkpoint
storage, no replica involved, whatever replica count wrote it.

The driver reads the snapshot's catalog (its parts' metadata) from storage; each input partition
reads one part's files on an executor, through the server's own format code
(``statehouse.snapshots``, shipped in the client distribution; its ``checkpoint`` extra brings
boto3 and zstandard). S3 credentials come the standard AWS way (environment, profile, instance
role), the endpoint of an S3-compatible server from ``option("s3_endpoint_url", ...)``.

Keyed state (``option("state", ...)``) reads as the live read does (the same schema, built by
the same code, ``statehouse.snapshots.stored.arrow``): one input partition per part and key-group sub-range.
A full or savepoint part (the canonical format) is range-read: the header and just the sections
of the partition's key groups; of an incremental RocksDB part, the files that can hold the
partition's key groups are downloaded to a temporary directory of the task, read by the server's
own reader (``statehouse.snapshots.incremental``), and removed after. Key filters read the keys' key
groups only. Operator state (``option("operator", ...)``) is one partition per part.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from statehouse.client.datasource.filters import PAGE_ROWS, KeyFilterPushdown, key_groups_of, split_range
from statehouse.client.datasource.operator import broadcast_rows, list_rows
from statehouse.client.datasource.options import CHECKPOINT_OPTIONS, SourceError, check_known, partitions_option
from statehouse.protocol.errors import StateError
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.catalog import find_parts, latest_complete, read_parts
from statehouse.snapshots.changelog import fetch_changelog
from statehouse.snapshots.full_format import fetch_key_groups
from statehouse.snapshots.handles import ChangelogHandle, IncrementalHandle, KeyGroupsHandle
from statehouse.snapshots.incremental import IncrementalPartReader
from statehouse.snapshots.metadata import SnapshotPart
from statehouse.snapshots.operator_format import OperatorStateData, list_elements
from statehouse.snapshots.storage import CheckpointStorage, open_storage
from statehouse.snapshots.stored.codec import encode_key
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.record_columns import StoredColumns, records_table


@dataclass(frozen=True)
class CheckpointOptions:
    """A read of a checkpoint or savepoint straight from checkpoint storage (``option("checkpoint",
    N)``), as parsed once from the source's options on the driver: which snapshot of which job,
    where the replicas keep it, and which state; every option a live read takes but a checkpoint
    read cannot is refused naming it."""

    job: str
    checkpoint_id: int | None  # None: the latest checkpoint every replica completed
    storage: str  # the replicas' STATEHOUSE_CHECKPOINT_DIR: a path or s3://bucket/prefix
    s3_endpoint_url: str | None
    operator: str | None  # None: keyed state
    state: str  # keyed: the state; operator: one of the operator's states, or "" for all
    partitions_per_part: int  # keyed: input partitions per part (its key groups, split evenly)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, splits: int = 1) -> CheckpointOptions:
        """``splits``: the input partitions per part when ``partitions_per_replica`` is not given."""
        given = {k.lower(): v for k, v in options.items()}
        spec = given["checkpoint"].strip()
        try:
            checkpoint_id = None if spec == "latest" else int(spec)
        except ValueError:
            checkpoint_id = -1
        if checkpoint_id is not None and checkpoint_id < 0:
            raise SourceError(
                f"option('checkpoint', ...) is a checkpoint or savepoint id, or 'latest'; got {given['checkpoint']!r}"
            )
        if not given.get("job") or not given.get("checkpoint_storage"):
            raise SourceError(
                "reading a checkpoint needs .option('job', ...) and .option('checkpoint_storage', ...): the replicas' "
                "STATEHOUSE_CHECKPOINT_DIR (a path, or s3://bucket/prefix with option('s3_endpoint_url') for "
                "an S3-compatible server)"
            )
        if given.get("timers") is not None or given.get("what") is not None:
            raise SourceError("option('timers') and option('what') read the live replicas, not a checkpoint")
        operator = given.get("operator") or None
        if operator is None and not given.get("state"):
            raise SourceError(
                "reading a checkpoint needs .option('state', ...) (a keyed state) or .option('operator', ...)"
            )
        splits = partitions_option(given, splits)
        check_known(given, CHECKPOINT_OPTIONS, "a checkpoint read (it reads storage, not the replicas)")
        return cls(
            given["job"],
            checkpoint_id,
            given["checkpoint_storage"],
            given.get("s3_endpoint_url") or None,
            operator,
            given.get("state", ""),
            splits,
        )

    def open(self) -> CheckpointStorage:
        return _opened(self.storage, self.s3_endpoint_url)

    @property
    def named(self) -> str:
        which = "the latest checkpoint" if self.checkpoint_id is None else f"checkpoint {self.checkpoint_id}"
        return f"{which} of job {self.job!r} in {self.storage}"


@functools.lru_cache(maxsize=8)
def _opened(location: str, s3_endpoint_url: str | None) -> CheckpointStorage:
    """One storage per location in a process: Spark's Python workers run task after task, and an S3
    client takes 0.2-0.5 s to build."""
    return open_storage(location, s3_endpoint_url=s3_endpoint_url)


def snapshot_parts(options: CheckpointOptions) -> list[SnapshotPart]:
    """The snapshot's parts, every one of its replica layout present (on the driver)."""
    try:
        storage = options.open()
        if options.checkpoint_id is None:
            parts = read_parts(storage, latest_complete(storage, options.job))
        else:
            _directory, parts = find_parts(storage, options.job, options.checkpoint_id)
    except StateError as exc:
        raise SourceError(f"statehouse: reading {options.named}: {exc}") from None
    count = parts[0].metadata.replica_count if parts else 0
    missing = sorted(set(range(count)) - {p.metadata.replica_index for p in parts})
    if not parts or missing:
        raise SourceError(
            f"statehouse: {options.named} is not complete (no part of replicas {missing} of {count}): read a "
            "checkpoint every replica completed ('latest' is one)"
        )
    return sorted(parts, key=lambda p: p.metadata.replica_index)


class CheckpointOperatorReader(DataSourceReader):
    """An operator's state in a checkpoint: one partition per part (its replica's subtasks' lists);
    the broadcast states from part 0, as every part holds them whole (Flink's)."""

    def __init__(self, options: CheckpointOptions, parts: Sequence[SnapshotPart]) -> None:
        self.options, self.parts = options, list(parts)

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(i) for i in range(len(self.parts))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part = self.parts[partition.value]
        options, operator, wanted = self.options, self.options.operator, self.options.state or None
        try:
            handle = part.metadata.operator.under(part.directory)
            data = OperatorStateData.from_bytes(options.open().read_verified(handle))
            for (op, name, subtask), raw in sorted(data.lists.items()):
                if op == operator and wanted in (None, name):
                    values = list_elements(raw)
                    if values:
                        yield list_rows(name, data.modes.get((op, name), "split"), subtask, values)
            if part.metadata.replica_index != 0:
                return
            for (op, name), entries in sorted(data.broadcast.items()):
                if op == operator and wanted in (None, name):
                    decoded = [(k.decode(), list_elements(v)[0]) for k, v in sorted(entries.items())]
                    yield broadcast_rows(name, decoded)
        except StateError as exc:
            raise SourceError(f"statehouse: reading operator {operator!r} from {options.named}: {exc}") from None


def stored_descriptor(options: CheckpointOptions, parts: Sequence[SnapshotPart]) -> StateDescriptor:
    """The keyed state's descriptor as the checkpoint recorded it (on the driver)."""
    recorded = {d["name"]: d for d in parts[0].metadata.states}
    if options.state not in recorded:
        raise SourceError(
            f"statehouse: {options.named} has no state {options.state!r}; its states: "
            f"{', '.join(sorted(recorded)) or 'none'}"
        )
    return StateDescriptor.from_dict(recorded[options.state])


class PartRange(InputPartition):
    """Key groups ``start``..``end`` of part ``part``; with ``keys``, only those keys' rows."""

    def __init__(self, part: int, start: int, end: int, keys: list[Any] | None = None) -> None:
        super().__init__((part, start, end))
        self.part, self.start, self.end, self.keys = part, start, end, keys


class CheckpointKeyedReader(KeyFilterPushdown, DataSourceReader):
    """A keyed state in a checkpoint: one partition per part and key-group sub-range, whatever the
    layout that wrote it (each key group is in exactly one part). TTL visibility is judged at the
    time Spark plans the read, the same for every partition."""

    def __init__(self, options: CheckpointOptions, parts: Sequence[SnapshotPart], descriptor: StateDescriptor) -> None:
        self.options, self.parts, self.descriptor = options, list(parts), descriptor
        self.max_parallelism = self.parts[0].metadata.max_parallelism
        self.first, self.last = 0, self.max_parallelism - 1
        self.keys: set[Any] | None = None
        self.now_ms = time.time_ns() // 1_000_000

    def partitions(self) -> Sequence[InputPartition]:
        found: list[InputPartition] = []
        if self.keys is not None:
            grouped = key_groups_of(self.keys, self.descriptor.key_type, self.max_parallelism, self.first, self.last)
            for group, keys in grouped.items():
                found.append(PartRange(self._part_of(group), group, group, keys))
            return found or [PartRange(0, 0, -1, [])]
        for index, part in enumerate(self.parts):
            owned = part.metadata.key_group_range
            start, end = max(owned.start, self.first), min(owned.end, self.last)
            if start <= end:
                ranges = split_range(start, end, self.options.partitions_per_part)
                found += [PartRange(index, low, high) for low, high in ranges]
        return found or [PartRange(0, 0, -1, [])]

    def _part_of(self, key_group: int) -> int:
        return next(i for i, p in enumerate(self.parts) if key_group in p.metadata.key_group_range)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, PartRange)
        if partition.start > partition.end:
            return
        descriptor, part = self.descriptor, self.parts[partition.part]
        wanted = KeyGroupRange(partition.start, partition.end)
        prefixes = None if partition.keys is None else tuple(encode_key(k, descriptor.key_type) for k in partition.keys)
        try:
            for stored in part_records(self.options.open(), part, descriptor.name, wanted):
                columns = stored if prefixes is None else _with_prefix(stored, prefixes)
                if columns is not None:
                    yield from records_table(descriptor, *columns, self.now_ms).to_batches()
        except StateError as exc:
            doing = f"reading state {descriptor.name!r} from {self.options.named}"
            raise SourceError(f"statehouse: {doing}: {exc}") from None


def _with_prefix(columns: StoredColumns, prefixes: tuple[bytes, ...]) -> StoredColumns | None:
    """Only the records whose primary starts with one of ``prefixes`` (a key filter's few keys)."""
    listed = [column.to_pylist() if isinstance(column, pa.Array) else list(column) for column in columns]
    kept = [i for i, primary in enumerate(listed[1]) if primary.startswith(prefixes)]
    if not kept:
        return None
    groups, primaries, secondaries, records = ([column[i] for i in kept] for column in listed)
    return groups, primaries, secondaries, records


def part_records(
    storage: CheckpointStorage, part: SnapshotPart, table: str, wanted: KeyGroupRange
) -> Iterator[StoredColumns]:
    """A table's stored records of ``wanted`` key groups in one part, in key group and key order,
    as columns: key groups, primaries, secondaries, values."""
    keyed = part.metadata.keyed
    if isinstance(keyed, KeyGroupsHandle):
        yield from fetch_key_groups(storage, keyed.under(part.directory), wanted).table_records(table)
        return
    if isinstance(keyed, ChangelogHandle):
        yield from fetch_changelog(storage, keyed.under(part.directory), wanted).table_records(table)
        return
    if isinstance(keyed, IncrementalHandle) and table in keyed.tables:
        yield from _incremental_records(storage, part, table, wanted)


def _incremental_records(
    storage: CheckpointStorage, part: SnapshotPart, table: str, wanted: KeyGroupRange
) -> Iterator[StoredColumns]:
    """An incremental part's files that can hold ``wanted``'s key groups, downloaded to a
    directory of this task (removed after) and read by the shared reader, which the server's
    restore uses too (it checks the database's max parallelism against the metadata)."""
    work = tempfile.mkdtemp(prefix="statehouse-part-")
    try:
        with IncrementalPartReader.download(storage, part, wanted, work) as reader:
            yield from reader.table_records(table, PAGE_ROWS)
    finally:
        shutil.rmtree(work, ignore_errors=True)
