"""Flink's ``SnapshotStrategyRunner``: a strategy's synchronous part inline, its asynchronous
part in the background."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from statehouse.backends.job import Job
from statehouse.backends.snapshot.full_strategy import JobStrategy
from statehouse.snapshots.strategy import SnapshotContext, SnapshotResult

log = logging.getLogger(__name__)

Outcome = Callable[[SnapshotResult | None, BaseException | None], None]


class SnapshotStrategyRunner:
    """Flink's ``SnapshotStrategyRunner``: runs a strategy's synchronous part (the freeze, under the
    job's exclusive lock) on the caller's thread and its asynchronous part (the upload) on a
    small thread pool it owns, reporting each outcome to a callback."""

    def __init__(self, threads: int = 2) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="statehouse-snapshot")

    def snapshot(self, job: Job, strategy: JobStrategy, ctx: SnapshotContext, done: Outcome) -> Future[None]:
        """Freeze the job now; upload in the background, then call ``done(result, error)``.

        The returned future completes after ``done`` returned. An exception of the synchronous
        part propagates here (nothing runs in the background then).
        """
        started = time.monotonic()
        strategy.settle(job)
        job.partition.flush()  # the slow part of a RocksDB freeze, while writes continue
        with job.exclusive():  # a consistent view: no write in the middle of the freeze
            async_part = strategy.prepare(job, ctx)
            committed_epoch, committed_batch = job.committed_epoch, job.committed_batch  # what the frozen state holds
        log.debug(
            "synchronous part of %s %d of job %s took %.1f ms",
            ctx.kind,
            ctx.checkpoint_id,
            ctx.job,
            (time.monotonic() - started) * 1000,
        )

        def run() -> None:
            try:
                result = dataclasses.replace(
                    async_part.run(), committed_epoch=committed_epoch, committed_batch=committed_batch
                )
            except BaseException as exc:
                done(None, exc)
            else:
                done(result, None)

        return self._executor.submit(run)

    def close(self) -> None:
        """Wait for running uploads (graceful shutdown)."""
        self._executor.shutdown(wait=True)
