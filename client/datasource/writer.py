"""Writing a DataFrame into a keyed state: a bootstrap or patch (``df.write``), or a stream's
micro-batches (``df.writeStream``), exactly once per Spark's own write protocol.

Executors stage their rows under their task attempt (the columnar client, ``job.columns(attempt)``)
and hand the driver a commit message; the driver commits the successful tasks' attempts as one
epoch on every replica and takes a global checkpoint — ``MicroBatchCoordinator.commit``, the path
``exactly_once`` takes. A failed task's or a speculative copy's staged rows are never named, so
they never apply; a write that fails applies nothing.

A bootstrap fences its epoch when Spark plans it (``writer()`` runs once per write, on the
driver). A stream's writer is made once per query and pickled to every micro-batch's tasks, so
they open the batch's epoch themselves: the one after the last committed epoch, the same for
every task of the batch (fencing only raises an epoch, so they agree). ``commit(messages,
batchId)`` then applies the batch unless the latest checkpoint already holds it (a replay after
a driver died between Statehouse's commit and Spark's: nothing applies twice).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from statehouse.client.attempts import CommitMessage, TaskAttempt
from statehouse.client.client import StatehouseClient
from statehouse.client.coordinator import BatchPlan, MicroBatchCoordinator, MicroBatchLost, StateBehind, job_at_boundary
from statehouse.client.datasource.options import WRITE_OPS, SourceError, SourceOptions, refusal
from statehouse.client.errors import StatehouseError
from statehouse.client.job import JobClient
from statehouse.protocol import routes
from statehouse.protocol.ops import OPS, STATE_KINDS

# Per operation a write takes: its columns (``ns`` is optional everywhere), and the state kinds it
# applies to, as the op table says.
COLUMNS = {op: OPS[op].columns or () for op in WRITE_OPS}
KINDS = {op: tuple(kind for kind in STATE_KINDS if kind in OPS[op].kinds) for op in WRITE_OPS}
_INTEGER_KEYS = ("int", "long")


@dataclass
class StagedRows(WriterCommitMessage):
    """A task attempt's commit message, and the epoch it staged under."""

    epoch: int
    message: dict[str, Any]


def _scalar_fits(value_type: str | None, kind: pa.DataType) -> bool:
    """Whether a column of Arrow type ``kind`` holds values a state of ``value_type`` takes."""
    if value_type is None:
        return True
    if value_type == "int64":
        return pa.types.is_integer(kind)
    if value_type == "float64":
        return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
    if value_type == "string":
        return pa.types.is_string(kind) or pa.types.is_large_string(kind)
    if value_type == "binary":
        return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
    return pa.types.is_boolean(kind)


def _value_fits(descriptor: dict[str, Any], op: str, kind: pa.DataType) -> bool:
    value_type, state_kind = descriptor.get("value_type"), descriptor["kind"]
    if state_kind == "list":
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return _scalar_fits(value_type, kind.value_type)
        return op == "add" and _scalar_fits(value_type, kind)
    if state_kind == "map" and op == "put":
        return pa.types.is_map(kind) and _scalar_fits(value_type, kind.item_type)
    return _scalar_fits(value_type, kind)


def check_columns(options: SourceOptions, descriptor: dict[str, Any], schema: StructType) -> None:
    """Refuse, before anything is written, a DataFrame whose columns do not fit the operation and the
    state: one message naming the column and what to do."""
    op, state, kind = options.op, options.state, descriptor["kind"]
    assert op is not None
    if kind not in KINDS[op]:
        fitting = [o for o, kinds in KINDS.items() if kind in kinds]
        raise SourceError(
            f"state {state!r} is a {kind} state: option('op', {op!r}) does not apply to it; use one of {fitting}"
        )
    arrow = to_arrow_schema(schema)
    names = arrow.names
    needed = COLUMNS[op]
    missing = [c for c in needed if c not in names]
    extra = [c for c in names if c not in needed and c != "ns"]
    if missing or extra:
        raise SourceError(
            f"op {op!r} writes the columns {', '.join(needed)} (and optionally ns); the DataFrame has "
            f"{', '.join(names)}: select those columns"
        )
    key_type = descriptor["key_type"]
    key = arrow.field("key").type
    if not (pa.types.is_integer(key) if key_type in _INTEGER_KEYS else pa.types.is_string(key)):
        raise SourceError(
            f"column 'key' is {key}, but state {state!r} has {key_type} keys: cast it "
            f"(col('key').cast('{'string' if key_type == 'string' else 'bigint'}'))"
        )
    for text in ("ns", "user_key"):
        if text in names and not pa.types.is_string(arrow.field(text).type):
            raise SourceError(f"column {text!r} is {arrow.field(text).type}: it must be a string column")
    if "value" in names and not _value_fits(descriptor, op, arrow.field("value").type):
        raise SourceError(
            f"column 'value' is {arrow.field('value').type}, which a {kind} state of value_type "
            f"{descriptor.get('value_type')} does not take with op {op!r}: cast it"
        )


def _job(client: StatehouseClient, options: SourceOptions) -> JobClient:
    return client.job(options.job)


class _Writer:
    """What both writers do on executors: stage the task's rows under its attempt."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.unit = uuid.uuid4().hex[:8]  # one write; with the partition, the unit of work
        try:
            with StatehouseClient(options.config) as client:
                check_columns(options, _job(client, options).describe(options.state), schema)
        except StatehouseError as exc:
            raise refusal(exc, f"writing state {options.state!r} of job {options.job!r}") from None

    def epoch_for_task(self, job: JobClient) -> int:
        raise NotImplementedError

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedRows:
        options = self.options
        try:
            with StatehouseClient(options.config) as client:
                job = _job(client, options)
                epoch = self.epoch_for_task(job)
                attempt = TaskAttempt.of_spark_task(epoch, len(job.replicas), self.unit)
                columns = job.columns(attempt)
                for batch in iterator:
                    if batch.num_rows:
                        self._apply(columns, batch)
                return StagedRows(epoch, attempt.message().to_dict())
        except StatehouseError as exc:
            raise refusal(exc, f"writing state {options.state!r} of job {options.job!r}") from None

    def _apply(self, columns: Any, batch: pa.RecordBatch) -> None:
        state, op = self.options.state, self.options.op
        names = batch.schema.names
        ns = batch.column("ns").fill_null("") if "ns" in names else ""
        keys = batch.column("key")
        if op == "clear":
            columns.clear(state, keys, ns)
        elif op == "map_put":
            columns.map_put(state, keys, batch.column("user_key"), batch.column("value"), ns)
        else:
            getattr(columns, str(op))(state, keys, batch.column("value"), ns)


def _messages(messages: list[WriterCommitMessage | None]) -> tuple[set[int], list[CommitMessage]]:
    staged = [m for m in messages if isinstance(m, StagedRows)]
    return {m.epoch for m in staged}, [CommitMessage.from_dict(m.message) for m in staged]


class BatchWriter(_Writer, DataSourceArrowWriter):
    """``df.write.format("statehouse")``: a bootstrap or patch, applied as one epoch or not at all."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        try:
            with StatehouseClient(options.config) as client:
                coordinator = MicroBatchCoordinator(_job(client, options))
                # A write is no micro-batch: it goes in between two of a stream on the same job,
                # and its checkpoint keeps the last one's batch id (with this write's epoch).
                applied = coordinator.applied().batch_id
                self.plan = BatchPlan(applied, coordinator.begin(applied + 1).epoch, replay=False)
        except StatehouseError as exc:
            raise refusal(exc, f"writing state {options.state!r} of job {options.job!r}") from None

    def epoch_for_task(self, job: JobClient) -> int:
        assert self.plan.epoch is not None
        return self.plan.epoch

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _epochs, staged = _messages(messages)
        try:
            with StatehouseClient(self.options.config) as client:
                MicroBatchCoordinator(_job(client, self.options)).commit(self.plan, staged)
        except StatehouseError as exc:
            raise refusal(exc, f"committing the write to state {self.options.state!r}") from None

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        with StatehouseClient(self.options.config) as client:
            assert self.plan.epoch is not None
            MicroBatchCoordinator(_job(client, self.options)).abort_epoch(self.plan.epoch)


class StreamWriter(_Writer, DataSourceStreamArrowWriter):
    """``df.writeStream.format("statehouse")``: each micro-batch applied exactly once."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        try:
            with StatehouseClient(options.config) as client:
                # When the query starts (and again before each commit, which makes a writer too): a
                # commit a dead driver left half done is undone before any task stages.
                job = job_at_boundary(client, options.job, f"the stream writer of job {options.job!r}")
                coordinator = MicroBatchCoordinator(job)
                coordinator.recover()
        except StatehouseError as exc:
            raise refusal(exc, f"writing state {options.state!r} of job {options.job!r}") from None

    def epoch_for_task(self, job: JobClient) -> int:
        infos = job.infos()
        target = max(max(i["committed_epoch"] for i in infos) + 1, max(i["epoch"] for i in infos))
        # A driver that died between sealing an epoch (prepare) and committing it left it closed to
        # writes: the batch Spark runs again stages under the next one (every task sees the same).
        reports = job.replicas.on_all("GET", routes.path(routes.EPOCH, job=job.name, epoch=target))
        if any(report["status"] == "sealed" for report in reports):
            target += 1
        return job.fence(target)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        epochs, staged = _messages(messages)
        try:
            with StatehouseClient(self.options.config) as client:
                what = f"micro-batch {batchId} of job {self.options.job!r}"
                coordinator = MicroBatchCoordinator(job_at_boundary(client, self.options.job, what))
                state = coordinator.applied()
                applied = state.batch_id
                if batchId <= applied:  # a replay: the state holds this batch already
                    for epoch in epochs:
                        coordinator.abort_epoch(epoch)
                    return
                if batchId > applied + 1:
                    raise StateBehind(
                        f"job {self.options.job!r} state holds micro-batches up to {applied}, so batch {batchId} "
                        "cannot be applied exactly once; restore a matching checkpoint or start a new query"
                    )
                if len(epochs) > 1:
                    raise MicroBatchLost(f"micro-batch {batchId}'s tasks staged under epochs {sorted(epochs)}")
                epoch = epochs.pop() if epochs else coordinator.job.fence(coordinator.job.epoch() + 1)
                coordinator.ensure_restore_point(state)  # what undoes this commit if it is left half done
                coordinator.commit(BatchPlan(batchId, epoch, replay=False), staged)
        except StatehouseError as exc:
            raise refusal(exc, f"committing micro-batch {batchId} to state {self.options.state!r}") from None

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        epochs, _staged = _messages(messages)
        with StatehouseClient(self.options.config) as client:
            coordinator = MicroBatchCoordinator(_job(client, self.options))
            for epoch in epochs:
                coordinator.abort_epoch(epoch)
