"""``option("checkpoint", N)``: state read from a completed checkpoint or savepoint in checkpoint
storage, no replica involved, whatever replica count wrote it.

The driver reads the snapshot's catalog (its parts' metadata) from storage; each input partition
reads one part's files on an executor, through the server's own format code
(``statehouse.snapshots``, shipped in the client distribution; its ``checkpoint`` extra brings
boto3 and zstandard). S3 credentials come the standard AWS way (environment, profile, instance
role), the endpoint of an S3-compatible server from ``option("s3_endpoint_url", ...)``.

Operator state (``option("operator", ...)``) is read so; keyed state is not yet (its rows need
the engine's value decoding in a layer the client shares), and is refused with what to do.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from statehouse.client.datasource.operator import broadcast_rows, list_rows
from statehouse.client.datasource.options import SourceError
from statehouse.errors import StateError
from statehouse.snapshots.catalog import find_snapshot, latest_complete, read_parts
from statehouse.snapshots.metadata import SnapshotPart
from statehouse.snapshots.operator_format import OperatorStateData, list_elements
from statehouse.snapshots.storage import CheckpointStorage, open_storage


@dataclass(frozen=True)
class CheckpointOptions:
    job: str
    checkpoint_id: int | None  # None: the latest checkpoint every replica completed
    storage: str  # the replicas' STATEHOUSE_CHECKPOINT_DIR: a path or s3://bucket/prefix
    s3_endpoint_url: str | None
    operator: str
    state: str  # one of the operator's states, or "" for all

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> CheckpointOptions:
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
        operator = given.get("operator")
        if not operator:
            raise SourceError(
                "a checkpoint's keyed state cannot be read yet (option('operator', name) reads its operator state): "
                "restore the checkpoint into a deployment (POST /v1/jobs/{job}/restore) and read the live replicas"
            )
        return cls(
            given["job"],
            checkpoint_id,
            given["checkpoint_storage"],
            given.get("s3_endpoint_url") or None,
            operator,
            given.get("state", ""),
        )

    def open(self) -> CheckpointStorage:
        return open_storage(self.storage, s3_endpoint_url=self.s3_endpoint_url)

    @property
    def named(self) -> str:
        which = "the latest checkpoint" if self.checkpoint_id is None else f"checkpoint {self.checkpoint_id}"
        return f"{which} of job {self.job!r} in {self.storage}"


def snapshot_parts(options: CheckpointOptions) -> list[SnapshotPart]:
    """The snapshot's parts, every one of its replica layout present (on the driver)."""
    try:
        storage = options.open()
        if options.checkpoint_id is None:
            directory = latest_complete(storage, options.job)
        else:
            directory = find_snapshot(storage, options.job, options.checkpoint_id)
        parts = read_parts(storage, directory)
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
