"""The bound on open RocksDB instances (``backends/rocksdb/pool.py``), on real RocksDB: idle
databases close and reopen on demand with their data, one in use (a request, a live iterator)
is never closed, and a scan left open across requests (a TTL cleanup cursor) keeps none open."""

from __future__ import annotations

import threading

import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.backends.rocksdb.partition import _SCAN_CHUNK
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.stored.descriptors import StateDescriptor


@pytest.fixture
def catalog(tmp_path):
    catalog = JobCatalog(RocksDBStore(str(tmp_path / "data"), max_open=2))
    yield catalog
    catalog.close()


def instances(catalog: JobCatalog) -> int:
    return len(catalog.store.instances)  # type: ignore[attr-defined]


def write(job, state: str, items: dict[str, object]) -> None:
    with job.transaction() as tx:
        for key, value in items.items():
            tx.value(state).update(key, value)


def read(job, state: str, key: str) -> object:
    with job.transaction() as tx:
        return tx.value(state).get(key)


def test_idle_databases_close_and_reopen_with_their_data(catalog):
    jobs = []
    for i in range(5):
        job, _ = catalog.create(f"j{i}", 128)
        job.register_state(StateDescriptor("v", "value"))
        write(job, "v", {"k": i})
        jobs.append(job)
        assert instances(catalog) <= 2
    assert [p.partition.is_open for p in jobs] == [False, False, False, True, True]  # least recently used first
    for round_ in range(3):
        for i, job in enumerate(jobs):
            assert read(job, "v", "k") == i + round_
            write(job, "v", {"k": i + round_ + 1})
            assert instances(catalog) <= 2


def test_a_database_in_use_is_not_closed(catalog):
    a, _ = catalog.create("a", 128)
    a.register_state(StateDescriptor("m", "map"))
    with a.transaction() as tx:
        tx.map("m").put_all("k", {f"u{i}": i for i in range(10)})
    key_group, primary = next(iter(a.keys("m"))).position
    entries = a.partition.items("m", key_group, primary)
    first = next(entries)  # a live iterator holds a lease
    for name in ("b", "c", "d"):  # three more databases open past the bound of two
        catalog.create(name, 128)
    assert a.partition.is_open and instances(catalog) == 2  # a (busy) and d; b and c closed
    assert len([first, *entries]) == 10  # the iterator ran to its end over the same database
    del entries
    catalog.create("e", 128)  # the next open closes the idle ones again
    assert not a.partition.is_open and instances(catalog) == 2


def test_a_scan_left_open_keeps_no_database_open(catalog):
    job, _ = catalog.create("big", 1)  # one key group: the whole state is one scan
    job.register_state(StateDescriptor("v", "value"))
    count = 2 * _SCAN_CHUNK + 7
    write(job, "v", {f"k{i:05}": i for i in range(count)})
    scan = job.partition.scan("v", 0)
    seen = [next(scan) for _ in range(_SCAN_CHUNK + 1)]  # into the second chunk
    for name in ("x", "y"):
        catalog.create(name, 128)
    assert not job.partition.is_open  # the suspended scan did not pin it
    seen += list(scan)  # and resumes over the reopened database, in order, without repeats
    assert [primary for primary, _secondary, _value in seen] == sorted(primary for primary, _s, _v in seen)
    assert len(seen) == count


def test_concurrent_requests_over_more_jobs_than_open_databases(catalog):
    jobs = []
    for i in range(6):
        job, _ = catalog.create(f"c{i}", 128)
        job.register_state(StateDescriptor("v", "value"))
        jobs.append(job)
    errors: list[BaseException] = []

    def work(job, worker: int) -> None:
        try:
            for n in range(40):
                write(job, "v", {f"w{worker}": n})
                assert read(job, "v", f"w{worker}") == n
                assert sum(1 for _ in job.keys("v")) >= 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(job, w)) for w in range(2) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert instances(catalog) <= len(threads)
    for job in jobs:
        assert read(job, "v", "w0") == 39 and read(job, "v", "w1") == 39


def test_a_closed_catalog_reopens_in_the_same_process(tmp_path):
    """No garbage collection on close: the databases' locks are free for the next open at once."""
    data = str(tmp_path / "data")
    catalog = JobCatalog(RocksDBStore(data))
    for i in range(20):
        job, _ = catalog.create(f"j{i}", 128)
        job.register_state(StateDescriptor("default", "value"))  # RocksDB's own column family name
        write(job, "default", {"k": i})
    catalog.close()
    reopened = JobCatalog(RocksDBStore(data, max_open=3))
    try:
        assert instances(reopened) == 0  # nothing opened before its first use
        for i in range(20):
            assert read(reopened.get(f"j{i}"), "default", "k") == i
        assert instances(reopened) <= 3
    finally:
        reopened.close()


def test_a_state_named_default_through_an_incremental_checkpoint(tmp_path, make_manager):
    """RocksDB's own default column family holds the job's metadata; a state named "default"
    lives in its own, in the live database, its native checkpoints and their restore."""
    catalog = JobCatalog(RocksDBStore(str(tmp_path / "data"), incremental_checkpoints=True, max_open=1))
    try:
        job, _ = catalog.create("j", 128)
        job.register_state(StateDescriptor("default", "map"))
        with job.transaction() as tx:
            tx.map("default").put_all("k", {"a": 1, "b": 2})
        manager = make_manager(catalog, open_storage(str(tmp_path / "checkpoints")))
        manager.trigger("j", 1)
        manager.wait("j", 1)
        manager.complete("j", 1)
        with job.transaction() as tx:
            tx.map("default").put_all("k", {"c": 3})
        catalog.create("other", 128)  # closes j's database (one open at a time)
        manager.restore("j", 1)
        with catalog.get("j").transaction() as tx:
            assert dict(tx.map("default").entries("k")) == {"a": 1, "b": 2}
    finally:
        catalog.close()
