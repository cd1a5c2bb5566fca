"""Spark glue: exactly-once ``foreachBatch`` and per-partition state access on executors.

Nothing here imports pyspark: the functions take and return plain callables, so the same
code runs on the driver (``foreachBatch``) and inside executor tasks (``mapPartitions``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from statehouse.client.batch import Batch
from statehouse.client.client import StatehouseClient
from statehouse.client.config import ClientConfig
from statehouse.client.coordinator import MicroBatchCoordinator
from statehouse.client.job import JobClient


@dataclass(frozen=True)
class BatchContext:
    """What an executor task needs to take part in one micro-batch attempt (picklable)."""

    config: ClientConfig
    job: str
    batch_id: int
    epoch: int | None
    replay: bool

    def writes(self, job: JobClient) -> Batch:
        """A batch whose writes are fenced with this attempt's epoch."""
        if self.replay:
            raise RuntimeError(f"micro-batch {self.batch_id} was applied already: a replay must not write")
        return job.batch(epoch=self.epoch)


def exactly_once(
    config: ClientConfig, job: str, process: Callable[[Any, BatchContext], None]
) -> Callable[[Any, int], None]:
    """Wrap ``process(df, ctx)`` for ``writeStream.foreachBatch``.

    Before ``process`` runs, the coordinator decides whether this attempt writes (with a
    freshly fenced epoch, after restoring the state if an earlier attempt may have written
    part of the batch) or is a replay of an applied batch (``ctx.replay``: read only).
    After ``process`` returns, the batch's global checkpoint is taken. If ``process``
    raises, nothing is checkpointed and Spark's retry of the batch starts over cleanly.
    """

    def run(df: Any, batch_id: int) -> None:
        with StatehouseClient(config) as client:
            coordinator = MicroBatchCoordinator(client.job(job))
            plan = coordinator.begin(batch_id)
            process(df, BatchContext(config, job, batch_id, plan.epoch, plan.replay))
            coordinator.commit(plan)

    return run


def with_state(
    ctx: BatchContext, fn: Callable[[Iterable[Any], JobClient, BatchContext], Iterable[Any]]
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """For ``rdd.mapPartitions``: opens one client per partition and hands ``fn`` the job."""

    def run(rows: Iterable[Any]) -> Iterator[Any]:
        with StatehouseClient(ctx.config) as client:
            yield from fn(rows, client.job(ctx.job), ctx)

    return run
