"""Engine work from the event loop: inline when it is short and nothing stands in its way, else
in a worker thread.

A thread hand-off costs tens of microseconds, a lot beside a single-key operation, so short work
runs inline. But the event loop serves every job and the probes: it must never wait for a job's
lock (held by a snapshot's synchronous part, a RocksDB flush, or an epoch commit), reopen a
closed RocksDB instance, or run a request of thousands of operations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from starlette.concurrency import run_in_threadpool

from statehouse.backends.job import Job, JobTransaction

T = TypeVar("T")

# Operations (or columnar rows) a request may carry and still run inline: at the measured
# 1-7 µs per operation, a few milliseconds at most.
INLINE_OPS = 1_000
OFF_LOOP = INLINE_OPS + 1  # the size to give work that always leaves the loop (whole-collection reads)


async def dispatch(job: Job, work: Callable[[], T], ops: int = 1) -> T:
    """``work()`` (which uses ``job``): inline if it is short and the job free and open."""
    if ops <= INLINE_OPS:
        with job.held_if_free() as free:
            if free:
                return work()
    return await run_in_threadpool(work)


async def in_transaction(job: Job, use: Callable[[JobTransaction], T], ops: int = 1, epoch: int | None = None) -> T:
    """``use(tx)`` in one transaction of ``job``, run as :func:`dispatch` runs work; with
    ``epoch``, fenced by the job's writer epoch (409 ``stale_epoch`` unless it is the current one)."""

    def work() -> T:
        with job.transaction(epoch) as tx:
            return use(tx)

    return await dispatch(job, work, ops)
