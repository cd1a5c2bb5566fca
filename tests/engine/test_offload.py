"""The event loop never waits for a job: work of a busy job (a snapshot holds its lock), of a
closed RocksDB instance, or of many operations runs in a worker thread; short work of a free job
runs inline. In-process: the rule is pure scheduling."""

from __future__ import annotations

import asyncio
import threading

import pytest

from statehouse.app.offload import INLINE_OPS, OFF_LOOP, dispatch, in_transaction
from statehouse.backends.catalog import JobCatalog
from statehouse.backends.heap import HeapStore
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.snapshots.stored.descriptors import StateDescriptor


@pytest.fixture
def job():
    job, _ = JobCatalog(HeapStore()).create("j", 128)
    job.register_state(StateDescriptor("v", "value"))
    return job


def where(ops: int, job) -> str:
    """The thread ``dispatch`` ran work of ``ops`` operations on: 'inline' or 'worker'."""

    async def main() -> str:
        loop_thread = threading.get_ident()
        ran_on = await dispatch(job, threading.get_ident, ops)
        return "inline" if ran_on == loop_thread else "worker"

    return asyncio.run(main())


def test_short_work_of_a_free_job_runs_inline_long_work_leaves_the_loop(job):
    assert where(1, job) == "inline"
    assert where(INLINE_OPS, job) == "inline"
    assert where(INLINE_OPS + 1, job) == "worker"
    assert where(OFF_LOOP, job) == "worker"


def test_the_loop_keeps_serving_while_a_snapshot_holds_the_job(job):
    """A thread holds the job's lock (as a snapshot's synchronous part does) until the event
    loop itself releases it: if the loop waited for the lock, this would never finish."""
    held, release = threading.Event(), threading.Event()

    def snapshot() -> None:
        with job.exclusive():
            held.set()
            release.wait(30)

    holder = threading.Thread(target=snapshot)
    holder.start()
    held.wait(10)

    async def main() -> object:
        write = asyncio.create_task(in_transaction(job, lambda tx: tx.value("v").update("k", 1)))
        await asyncio.sleep(0.05)  # the write is waiting for the lock, in a worker thread
        assert not write.done()
        release.set()  # the loop is free to run this: the snapshot ends, the write goes on
        await asyncio.wait_for(write, 10)
        return await in_transaction(job, lambda tx: tx.value("v").get("k"))

    assert asyncio.run(main()) == 1
    holder.join(10)


def test_a_closed_rocksdb_instance_is_reopened_off_the_loop(tmp_path):
    catalog = JobCatalog(RocksDBStore(str(tmp_path / "data")))
    job, _ = catalog.create("r", 128)
    assert job.partition.close_idle()  # what the open-instance limit does to an idle job
    assert not job.partition.is_open
    assert where(1, job) == "worker"
    catalog.close()
