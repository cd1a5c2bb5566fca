"""Spark glue: exactly-once ``foreachBatch`` with state updates staged per task attempt.

Nothing here imports pyspark at module level: the functions take and return plain callables,
so the same code runs on the driver (``foreachBatch``) and inside executor tasks
(``mapPartitions``, ``mapInPandas``, ``mapInArrow``, ``applyInPandas``). Commit messages travel back to the driver
in an accumulator, which Spark merges for successful tasks only — the driver's side of
Spark's own write protocol. Nor does it import pandas or pyarrow: the columnar helpers load
them inside the task.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statehouse.client.attempts import CommitMessage, TaskAttempt
from statehouse.client.batch import Batch
from statehouse.client.client import StatehouseClient
from statehouse.client.config import ClientConfig
from statehouse.client.coordinator import BatchPlan, MicroBatchCoordinator, MicroBatchLost, job_at_boundary
from statehouse.client.errors import StatehouseError
from statehouse.client.job import JobClient
from statehouse.client.timers import Timer
from statehouse.protocol.keygroups import KeyGroupRange, assign_to_key_group, operator_index

if TYPE_CHECKING:
    from statehouse.client.columns import Columns

log = logging.getLogger(__name__)


class CommitMessages:
    """An ``AccumulatorParam`` (by duck typing, so this module needs no pyspark) that collects
    the commit messages of successful tasks as plain dicts."""

    def zero(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return []

    def addInPlace(self, value: list[dict[str, Any]], more: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # A task reporting as it goes (with_state_grouped: per group) sends parts of one
        # attempt one after the other: added up here, a task hands the driver one message.
        for message in more:
            last = value[-1] if value else None
            if last is not None and all(last[k] == message[k] for k in ("unit", "partition", "task", "attempt")):
                value[-1] = {**last, "ops": [a + b for a, b in zip(last["ops"], message["ops"], strict=True)]}
            else:
                value.append(message)
        return value


@dataclass(frozen=True)
class BatchContext:
    """What a task needs to take part in one micro-batch attempt (picklable). Inside a task
    (``with_state``) it also carries the task's ``attempt``."""

    config: ClientConfig
    job: str
    batch_id: int
    epoch: int | None
    replay: bool
    messages: Any = None  # the accumulator of commit messages (absent on a replay)
    attempt: TaskAttempt | None = None
    # The topology version the driver began the batch under: a task's client takes the layout and
    # the job its process remembers at that version without asking (StatehouseClient.job).
    version: int | None = None

    def writes(self, job: JobClient) -> Batch:
        """A batch staged under this task attempt: its reads see its own writes; the writes
        count once the driver commits the micro-batch with this attempt as the winner."""
        if self.replay:
            raise RuntimeError(
                f"micro-batch {self.batch_id} was applied and checkpointed already: a replay must not write "
                "(check ctx.replay and only read)"
            )
        if self.attempt is None:
            raise RuntimeError("ctx.writes() works inside a task: wrap the partition function with with_state(ctx, fn)")
        return job.batch(attempt=self.attempt)

    def reads(self, job: JobClient) -> Batch:
        """A batch for reads: the attempt's own staged writes included (read-your-writes); on a
        replay, the committed state."""
        if self.replay or self.attempt is None:
            return job.batch()
        return job.batch(attempt=self.attempt)

    def columns(self, job: JobClient) -> Columns:
        """Columnar operations for this task attempt: writes staged under it (rows count as its
        writes), reads see its own writes; on a replay, reads of the committed state only (a
        write raises)."""
        if self.replay:
            return job.columns(
                read_only=f"micro-batch {self.batch_id} was applied and checkpointed already: a replay must not "
                "write (check ctx.replay and only read)"
            )
        if self.attempt is None:
            return job.columns(
                read_only="ctx.columns() writes inside a task: wrap the function with with_state_pandas(ctx, fn), "
                "with_state_arrow(ctx, fn) or with_state(ctx, fn)"
            )
        return job.columns(self.attempt)

    def fire_timers(self, job: JobClient, to: int, *, partitions: int, domain: str = "event") -> list[Timer]:
        """Inside a task over :func:`by_key_group` partitions: advance the watermark (or the
        clock) to ``to`` and fire the timers of this partition's key groups, staged under the
        task attempt (a retried attempt fires the same timers again; the committed attempt's
        firing is the one that counts). ``partitions`` is the partition count given to
        :func:`by_key_group`. Spark's ``handleExpiredTimer``: run it for each returned timer.

        On a replay the batch's firing was committed already: nothing fires (an empty list)."""
        if self.replay:
            return []
        if self.attempt is None:
            raise RuntimeError("ctx.fire_timers() works inside a task: wrap the function with with_state(ctx, fn)")
        groups = KeyGroupRange.for_operator(job.max_parallelism, partitions, self.attempt.partition)
        return job.timers(domain).advance(to, attempt=self.attempt, key_groups=groups)

    def for_task(self, replica_count: int, unit: str) -> BatchContext:
        if self.replay:
            return self
        assert self.epoch is not None
        return dataclasses.replace(self, attempt=TaskAttempt.of_spark_task(self.epoch, replica_count, unit))

    def report(self) -> None:
        """Hand the driver the task attempt's commit message: its writes since its last report
        (the partition is done; or, in :func:`with_state_grouped`, a group)."""
        if self.attempt is not None and self.messages is not None:
            self.messages.add([self.attempt.unreported().to_dict()])

    def collected(self) -> list[CommitMessage]:
        """On the driver, after the batch's Spark jobs: the successful tasks' messages."""
        return [CommitMessage.from_dict(m) for m in (self.messages.value if self.messages is not None else [])]


def exactly_once(
    config: ClientConfig, job: str, process: Callable[[Any, BatchContext], None], *, reruns: int = 2
) -> Callable[[Any, int], None]:
    """Wrap ``process(df, ctx)`` for ``writeStream.foreachBatch``.

    Before ``process`` runs, the coordinator decides whether this attempt writes (under a
    freshly fenced epoch) or is a replay of an applied batch (``ctx.replay``: read only).
    After ``process`` returns, the successful tasks' attempts are committed on every replica
    and the batch's global checkpoint is taken. If ``process`` raises, nothing is committed.
    When a replica lost the batch's staged writes (it restarted or was restored meanwhile), or a
    live rescale met the batch, the micro-batch is re-run, at most ``reruns`` times, before the
    error reaches Spark; an error that ends it aborts its epoch (a live rescale waits for no
    failed batch).
    """

    def run(df: Any, batch_id: int) -> None:
        with StatehouseClient(config) as client:
            coordinator = MicroBatchCoordinator(job_at_boundary(client, job, f"micro-batch {batch_id} of job {job!r}"))
            for rerun in range(reruns + 1):
                plan = coordinator.begin(batch_id)
                messages = None if plan.replay else df.sparkSession.sparkContext.accumulator([], CommitMessages())
                version = client.replicas.version
                ctx = BatchContext(config, job, batch_id, plan.epoch, plan.replay, messages, version=version)
                try:
                    process(df, ctx)
                    coordinator.commit(plan, ctx.collected())
                    return
                except Exception as exc:
                    if rerun == reruns or not _lost(coordinator, plan, exc):
                        if plan.epoch is not None:
                            coordinator.abort_epoch(plan.epoch)
                        raise
                    log.warning("micro-batch %d of job %r is re-run: %s", batch_id, job, exc)

    return run


def _lost(coordinator: MicroBatchCoordinator, plan: BatchPlan, exc: Exception) -> bool:
    """Whether a failed micro-batch lost its staged writes to a replica restart or restore (so a
    re-run can succeed), rather than failing on its own."""
    if isinstance(exc, MicroBatchLost):
        return True
    try:
        return coordinator.moved_on(plan)
    except StatehouseError:
        return False  # a replica is unreachable: let the original error speak


def by_key_group(pairs: Any, max_parallelism: int, partitions: int, key_type: str = "string") -> Any:
    """An RDD of ``(key, value)`` pairs partitioned by the keys' Statehouse key groups: partition
    ``p`` holds the keys of key groups ``KeyGroupRange.for_operator(max_parallelism, partitions,
    p)`` (Flink's assignment of key groups to subtasks), so its task may fire the timers of its
    own key groups (:meth:`BatchContext.fire_timers`) and no two tasks fire one timer."""
    if not 0 < partitions <= max_parallelism:
        raise ValueError(f"partitions must be in [1, max_parallelism={max_parallelism}]; got {partitions}")

    def partition_of(key: Any) -> int:
        return operator_index(max_parallelism, partitions, assign_to_key_group(key, key_type, max_parallelism))  # type: ignore[arg-type]

    return pairs.partitionBy(partitions, partition_of)


def with_state(
    ctx: BatchContext, fn: Callable[[Iterable[Any], JobClient, BatchContext], Iterable[Any]]
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """For ``rdd.mapPartitions``: opens one client per partition and hands ``fn`` the job and
    the task's context (its attempt). ``fn``'s iterator must be consumed to the end: the
    attempt reports its writes to the driver only then.

    Each call is one state update: however often Spark computes a partition of it (task
    retries, speculative copies, a second action over the same RDD), one attempt commits."""
    unit = uuid.uuid4().hex[:8]

    def run(rows: Iterable[Any]) -> Iterator[Any]:
        with StatehouseClient(ctx.config) as client:
            job = client.job(ctx.job, version=ctx.version)
            task_ctx = ctx.for_task(len(job.replicas), unit)
            yield from fn(rows, job, task_ctx)
            task_ctx.report()

    return run


def with_state_pandas(
    ctx: BatchContext, fn: Callable[[Any, Columns, BatchContext], Any]
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """For ``df.mapInPandas(with_state_pandas(ctx, fn), schema)``: ``fn(batch, columns, ctx)``
    runs for every pandas DataFrame of the task's partition, with one client and one task
    attempt per task (``columns`` is ``ctx.columns(job)``), and returns a DataFrame (or
    ``None``, or an iterable of DataFrames). A batch reads and updates state in as few as two
    requests per replica (``columns.add(...)`` then ``columns.get(...)``). When the partition
    is done, the attempt reports its commit message, as :func:`with_state` does.

    For ``applyInPandas`` see :func:`with_state_grouped`: it costs requests per group, where
    grouping inside ``fn`` (``batch.groupby("user_id")``, after ``df.repartition("user_id")``)
    costs them per Arrow batch."""

    def outputs(result: Any) -> Iterator[Any]:
        import pandas as pd  # type: ignore[import-untyped]  # inside the task: the columnar extra

        if isinstance(result, pd.DataFrame):
            yield result
        elif result is not None:
            yield from result

    return _with_columns(ctx, fn, outputs)


def with_state_arrow(
    ctx: BatchContext, fn: Callable[[Any, Columns, BatchContext], Any]
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """For ``df.mapInArrow(with_state_arrow(ctx, fn), schema)``: as :func:`with_state_pandas`,
    for ``pyarrow.RecordBatch`` batches; ``fn`` returns a RecordBatch, a Table, ``None`` or an
    iterable of RecordBatches."""

    def outputs(result: Any) -> Iterator[Any]:
        import pyarrow as pa

        if isinstance(result, pa.RecordBatch):
            yield result
        elif isinstance(result, pa.Table):
            yield from result.to_batches()
        elif result is not None:
            yield from result

    return _with_columns(ctx, fn, outputs)


def with_state_grouped(ctx: BatchContext, fn: Callable[[Any, Columns, BatchContext], Any]) -> Callable[[Any], Any]:
    """For ``df.groupBy(key).applyInPandas(with_state_grouped(ctx, fn), schema)`` (or
    ``applyInArrow``): ``fn(group, columns, ctx)`` runs for every group (a pandas DataFrame, or
    a ``pyarrow.Table``) and returns what Spark expects of the function. The groups of a task
    share one client and one task attempt (``columns`` is ``ctx.columns(job)``), so a group's
    reads see the writes of the task's earlier groups. Spark gives no signal for a task's last
    group, so the attempt reports the writes of each group when the group is done, and the
    parts add up to one commit message; Spark merges them for successful tasks only.

    Every group costs its own requests (at least one per state it touches and replica): with
    small groups far more than the row-wise client, which sends a partition's users in one
    batch (bench/RESULTS.md §9). For throughput, put a key's rows in one
    partition (``df.repartition("user_id")``), use :func:`with_state_pandas` and group inside
    ``fn``: requests per Arrow batch instead of per group."""
    unit = uuid.uuid4().hex[:8]  # one state update, however often Spark computes a partition of it
    # PySpark unpickles the function for each task, so this holds one task's session.
    current: list[_TaskSession] = []

    def run(group: Any) -> Any:
        session = _task_session(current, ctx, unit)
        result = fn(group, session.columns, session.ctx)
        session.ctx.report()
        return result

    return run


@dataclass
class _TaskSession:
    task: int  # Spark's task attempt id
    client: StatehouseClient
    ctx: BatchContext
    columns: Columns


def _task_session(current: list[_TaskSession], ctx: BatchContext, unit: str) -> _TaskSession:
    """The session of the Spark task this runs in, made at its first group. Its client closes
    when the session goes, with the task's copy of the function."""
    from pyspark import TaskContext  # only ever called inside a Spark task

    task_context = TaskContext.get()
    if task_context is None:
        raise RuntimeError("not inside a Spark task: use with_state_grouped(ctx, fn) in applyInPandas")
    task = task_context.taskAttemptId()
    if current and current[0].task == task:
        return current[0]
    current.clear()  # a function kept across tasks: never one attempt for two tasks
    client = StatehouseClient(ctx.config)
    try:
        job = client.job(ctx.job, version=ctx.version)
        task_ctx = ctx.for_task(len(job.replicas), unit)
        session = _TaskSession(task, client, task_ctx, task_ctx.columns(job))
    except BaseException:
        client.close()
        raise
    weakref.finalize(session, client.close)
    current.append(session)
    return session


def _with_columns(
    ctx: BatchContext,
    fn: Callable[[Any, Columns, BatchContext], Any],
    outputs: Callable[[Any], Iterator[Any]],
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    unit = uuid.uuid4().hex[:8]  # one state update, however often Spark computes a partition of it

    def run(batches: Iterable[Any]) -> Iterator[Any]:
        with StatehouseClient(ctx.config) as client:
            job = client.job(ctx.job, version=ctx.version)
            task_ctx = ctx.for_task(len(job.replicas), unit)
            columns = task_ctx.columns(job)
            for batch in batches:
                yield from outputs(fn(batch, columns, task_ctx))
            task_ctx.report()

    return run
