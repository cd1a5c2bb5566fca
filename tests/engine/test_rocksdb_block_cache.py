"""Every job's RocksDB on a replica shares one block cache (``STATEHOUSE_ROCKSDB_BLOCK_CACHE_BYTES``,
backends/rocksdb/store.py), as Flink shares one per slot: memory bounded per replica, not per job."""

from __future__ import annotations

import httpx
import pytest

from statehouse.backends.base.partition import WriteOp
from statehouse.backends.rocksdb.store import RocksDBStore
from tests.support.server import start_server

CACHE = 4 << 20
KEYS = 20_000


def _fill_and_read(store: RocksDBStore, job: str) -> None:
    partition = store.open_partition(job, 128)
    partition.create_table("s", False)
    value = b"v" * 100
    ops = [WriteOp("put", "s", k % 128, b"key-%06d" % k, value=value) for k in range(KEYS)]
    partition.write(ops)
    partition.flush()  # into table files: reads now go through the block cache
    for k in range(KEYS):
        assert partition.get("s", k % 128, b"key-%06d" % k) == value


def test_jobs_share_one_bounded_block_cache(tmp_path):
    store = RocksDBStore(str(tmp_path), block_cache_bytes=CACHE)
    assert store.block_cache is not None
    _fill_and_read(store, "a")
    after_one = store.block_cache.get_usage()
    assert 0 < after_one <= CACHE
    _fill_and_read(store, "b")  # ~2 MB of blocks each: the second job's land in the same cache
    after_two = store.block_cache.get_usage()
    assert after_one < after_two <= CACHE


def test_zero_leaves_each_job_rocksdbs_own_cache(tmp_path):
    store = RocksDBStore(str(tmp_path), block_cache_bytes=0)
    assert store.block_cache is None
    _fill_and_read(store, "a")


@pytest.mark.http
def test_the_gauges_report_the_shared_caches(tmp_path):
    env = {"STATEHOUSE_BACKEND": "rocksdb", "STATEHOUSE_ROCKSDB_BLOCK_CACHE_BYTES": str(CACHE)}
    server = start_server(tmp_path, env)
    try:
        http = httpx.Client(base_url=server.url, timeout=30)
        http.put("/v1/jobs/j", json={"max_parallelism": 128}).raise_for_status()
        http.put("/v1/jobs/j/states/s", json={"kind": "value"}).raise_for_status()
        body = {"ops": [{"op": "put", "state": "s", "key": f"k{i}", "value": i} for i in range(500)]}
        http.post("/v1/jobs/j/batch", json=body).raise_for_status()
        http.post("/v1/jobs/j/checkpoints", json={"checkpoint_id": 1}).raise_for_status()  # flushes
        http.post("/v1/jobs/j/batch", json={"ops": [{"op": "get", "state": "s", "key": "k1"}]}).raise_for_status()
        metrics = http.get("/metrics").text
        line = next(x for x in metrics.splitlines() if x.startswith("statehouse_rocksdb_block_cache_bytes "))
        assert 0 < float(line.split()[1]) <= CACHE
        # The read went through the row cache in front of it (64 MiB by default) too.
        line = next(x for x in metrics.splitlines() if x.startswith("statehouse_rocksdb_row_cache_bytes "))
        assert 0 < float(line.split()[1]) <= 64 << 20
    finally:
        server.stop()


@pytest.mark.parametrize("flushed", [False, True])
def test_many_keys_are_read_in_one_multi_get_in_their_own_order(tmp_path, flushed):
    """A read of many keys (a columnar request's) goes through one multi-get in key order, and
    answers in the caller's order, absent keys as None, from the memtable and the table files."""
    store = RocksDBStore(str(tmp_path), block_cache_bytes=CACHE)
    partition = store.open_partition("j", 128)
    partition.create_table("s", False)
    partition.write([WriteOp("put", "s", k % 128, b"key-%06d" % k, value=b"v%d" % k) for k in range(0, 1000, 2)])
    if flushed:
        partition.flush()
    wanted = [997, 4, 4, 999_999, 0, 13, 500, *range(998, 0, -7)]
    got = partition.get_many("s", [k % 128 for k in wanted], [b"key-%06d" % k for k in wanted])
    assert got == [b"v%d" % k if k % 2 == 0 and k < 1000 else None for k in wanted]
    assert len(wanted) >= 64  # many: the multi-get
    assert got == [partition.get("s", k % 128, b"key-%06d" % k) for k in wanted]  # as point gets answer
