"""RocksDB state survives closing and reopening the backend from its directory."""

import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.errors import InsufficientStorage
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.ttl import TtlConfig


def test_state_survives_reopen(tmp_path):
    data = str(tmp_path / "data")
    catalog = JobCatalog(RocksDBStore(data))
    job, _ = catalog.create("orders", 256)
    job.register_state(StateDescriptor("total", "reducing", function="sum", ttl=TtlConfig(10**9)))
    job.register_state(StateDescriptor("items", "map", key_type="long"))
    with job.transaction() as tx:
        tx.reducing("total").add("u1", 5)
        tx.reducing("total").add("u1", 7)
        tx.map("items").put_all(1 << 40, {"x": 1, "y": [1, 2]})
        tx.operator.list_update("src", 3, "offsets", [10, 20])
        tx.operator.broadcast_put("rules", "cfg", "k", "v")
    catalog.close()

    reopened = JobCatalog(RocksDBStore(data))
    assert reopened.names() == ["orders"]
    job = reopened.get("orders")
    assert job.max_parallelism == 256
    assert job.descriptor("total").function == "sum" and job.descriptor("total").ttl.ttl_ms == 10**9
    with job.transaction() as tx:
        assert tx.reducing("total").get("u1") == 12
        assert tx.map("items").get_all(1 << 40) == {"x": 1, "y": [1, 2]}
        assert tx.operator.list_get("src", 3, "offsets") == [10, 20]
        assert tx.operator.broadcast_get("rules", "cfg", "k") == "v"
    reopened.delete("orders")
    reopened.close()
    assert JobCatalog(RocksDBStore(data)).names() == []


def test_key_layout_is_key_group_prefixed(tmp_path):
    """A key group is one contiguous byte range: 1-byte prefix at max parallelism 128, 2 above."""
    from rocksdict import Options, Rdict

    for max_p, width in [(128, 1), (512, 2)]:
        data = tmp_path / f"d{max_p}"
        catalog = JobCatalog(RocksDBStore(str(data)))
        job, _ = catalog.create("j", max_p)
        job.register_state(StateDescriptor("v", "value"))
        with job.transaction() as tx:
            tx.value("v").update("hello", 1)
        kg = job.keyspace.key_group("hello", job.descriptor("v").key_type)
        catalog.close()
        path = str(data / "j")
        families = {cf: Options(raw_mode=True) for cf in Rdict.list_cf(path) if cf != "default"}
        db = Rdict(path, Options(raw_mode=True), column_families=families)
        family = db.get_column_family("v")
        keys = list(family.keys())
        assert len(keys) == 1 and keys[0][:width] == kg.to_bytes(width, "big")
        del keys, family
        db.close()


def test_every_column_family_is_written_with_bloom_filters(tmp_path):
    # Point reads (gets, the read of an add) skip files without their key: RocksDB's own record
    # of the options it runs with (its OPTIONS file), for the database and each state's family.
    data = tmp_path / "data"
    catalog = JobCatalog(RocksDBStore(str(data)))
    job, _ = catalog.create("orders", 128)
    job.register_state(StateDescriptor("total", "reducing", function="sum"))
    catalog.close()
    options = max(data.rglob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1])).read_text()
    families = options.count("[CFOptions ")
    assert families >= 2 and options.count("filter_policy=bloomfilter\n") == families


def test_a_read_of_expired_entries_answers_below_the_disk_reserve(tmp_path, clock):
    """In process, where tests/operations/test_disk_full.py's tmpfs cannot be mounted (it needs root): with a
    reserve above the volume's size every write is refused, and a read whose only changes are
    TTL cleanups answers all the same, its cleanup dropped until space is back."""
    data = str(tmp_path / "data")
    catalog = JobCatalog(RocksDBStore(data), clock=clock)
    job, _ = catalog.create("j", 128)
    job.register_state(StateDescriptor("t", "value", ttl=TtlConfig(100)))
    with job.transaction() as tx:
        tx.value("t").update("k", 1)
    catalog.close()
    clock.advance(200)

    full = JobCatalog(RocksDBStore(data, disk_reserve_bytes=1 << 62), clock=clock)
    try:
        job = full.get("j")
        with job.transaction() as tx:
            assert tx.value("t").get("k") is None
        with pytest.raises(InsufficientStorage), job.transaction() as tx:
            tx.value("t").get("k")
            tx.value("t").update("other", 2)  # a write in the same transaction: refused, as before
        assert [stored.key for stored in job.keys("t")] == ["k"]  # still there, invisible
    finally:
        full.close()

    roomy = JobCatalog(RocksDBStore(data), clock=clock)
    try:
        job = roomy.get("j")
        with job.transaction() as tx:
            assert tx.value("t").get("k") is None
        assert list(job.keys("t")) == []  # cleaned up once writes are taken
    finally:
        roomy.close()
