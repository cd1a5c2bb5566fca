"""Restore across replica counts (2→3, 3→2) and across backends (heap ⇄ RocksDB)."""

from __future__ import annotations

import uuid

import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.heap import HeapStore
from statehouse.backends.redistribution import OperatorSubtaskState, redistribute
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.protocol.keygroups import assign_to_key_group
from statehouse.snapshots.errors import RestoreIncomplete
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.stored.codec import decode_primary
from tests.support.job_contents import dump, global_checkpoint, operator_dump, owner, populate


def _layout(make_catalog, count, tmp_path, tag):
    return [make_catalog(i, count, tmp_path / f"{tag}-{i}") for i in range(count)]


def _checkpoint(make_manager, catalogs, storage, checkpoint_id, **kwargs):
    managers = [make_manager(c, storage, **kwargs) for c in catalogs]
    global_checkpoint(managers, "orders", checkpoint_id)
    return managers


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2)])
def test_rescale(make_catalog, make_manager, tmp_path, old, new):
    storage = open_storage(f"memory://{uuid.uuid4().hex}")
    before = _layout(make_catalog, old, tmp_path, "old")
    expected = {}
    for catalog in before:
        job, _ = catalog.create("orders", 128)
        populate(job, 300, tag=f"r{catalog.replica_index}")
        expected.update(dump(job))
    for m in _checkpoint(make_manager, before, storage, 1):
        m.close()  # the old layout stops

    after = _layout(make_catalog, new, tmp_path, "new")
    seen = {}
    lists = {}
    for catalog in after:
        info = make_manager(catalog, storage).restore("orders", 1, operator_parallelism={"src": new})
        assert len(info.parts) == old
        job = catalog.get("orders")
        assert tuple(job.key_group_range.as_list()) == info.key_group_range
        for entry, value in dump(job).items():
            assert entry not in seen, "a key restored on two replicas"
            table, key_group, primary, _secondary = entry
            key_type = job.descriptor(table).key_type
            key, _namespace = decode_primary(primary, key_type)
            assert assign_to_key_group(key, key_type, 128) == key_group, "a key stored under another key group"
            assert owner(key, key_type, 128, new) == catalog.replica_index, "a key restored on a replica not owning it"
            seen[entry] = value
        with job.transaction() as tx:
            for subtask in range(new):
                if subtask % new == catalog.replica_index:
                    lists[subtask] = tx.operator.list_get("src", subtask, "offsets")
                    assert sorted(tx.operator.list_get("src", subtask, "all")) == [f"u{i}" for i in range(old)]
            assert tx.operator.broadcast_get("rules", "cfg", "limit") == 10
    assert seen == expected  # every key exactly once, on its new owner

    old_states = [OperatorSubtaskState(lists={"offsets": ("split", [i, f"r{i}"])}) for i in range(old)]
    want = redistribute(old_states, new)
    assert lists == {s: (want[s].lists["offsets"][1] or None) for s in range(new)}


def test_restore_refuses_missing_parts(make_catalog, make_manager, tmp_path):
    storage = open_storage(f"memory://{uuid.uuid4().hex}")
    before = _layout(make_catalog, 2, tmp_path, "old")
    for catalog in before:
        populate(catalog.create("orders", 128)[0], 50)
    managers = [make_manager(c, storage) for c in before]
    for m in managers:
        m.trigger("orders", 1)
    managers[0].complete("orders", 1)  # replica 1 never completes
    target = make_catalog(0, 1, tmp_path / "single")
    with pytest.raises(RestoreIncomplete, match="do not cover key groups 64-127"):
        make_manager(target, storage).restore("orders", 1)
    # replica 0 of 2 only needs its own part
    fresh = make_catalog(0, 2, tmp_path / "fresh")
    make_manager(fresh, storage).restore("orders", 1)


def test_savepoint_moves_between_backends(make_manager, tmp_path):
    storage = open_storage(str(tmp_path / "cp"))
    heap = JobCatalog(HeapStore())
    job, _ = heap.create("orders", 256)
    populate(job, 200, tag="heap")
    expected, expected_ops = dump(job), operator_dump(job)
    manager = make_manager(heap, storage)
    manager.trigger("orders", 1, kind="savepoint")
    location = manager.complete("orders", 1).location
    assert location.endswith("orders/savepoints/sp-1")

    rocks = JobCatalog(RocksDBStore(str(tmp_path / "rocks")))
    rocks_manager = make_manager(rocks, storage)
    rocks_manager.restore("orders", location=location)
    assert dump(rocks.get("orders")) == expected and operator_dump(rocks.get("orders")) == expected_ops

    # and back: an incremental RocksDB checkpoint restores into the heap backend
    rocks_manager.trigger("orders", 2)
    assert rocks_manager.complete("orders", 2).format == "incremental"
    heap2 = JobCatalog(HeapStore())
    make_manager(heap2, storage).restore("orders", 2)
    assert dump(heap2.get("orders")) == expected
    rocks.close()


def test_partial_restore_reads_about_half(make_manager, tmp_path):
    storage = open_storage(str(tmp_path / "cp"))
    source = JobCatalog(HeapStore(incremental_checkpoints=False))
    job, _ = source.create("orders", 128)
    populate(job, 3000)
    manager = make_manager(source, storage, compression="none")
    manager.trigger("orders", 1)
    manager.complete("orders", 1)
    keyed_size = len(storage.read("orders/chk-1/replica-0-of-1/keyed.bin"))

    half = JobCatalog(HeapStore(), replica_index=1, replica_count=2)
    info = make_manager(half, storage).restore("orders", 1)
    keyed_read = info.bytes_read
    assert 0.4 * keyed_size < keyed_read < 0.62 * keyed_size, (keyed_read, keyed_size)


def test_old_layout_checkpoints_are_subsumed_after_rescale(make_catalog, make_manager, tmp_path):
    storage = open_storage(f"memory://{uuid.uuid4().hex}")
    before = _layout(make_catalog, 2, tmp_path, "old")
    for catalog in before:
        populate(catalog.create("orders", 128)[0], 100)
    old_managers = _checkpoint(make_manager, before, storage, 1, num_retained=2)
    for m in old_managers:
        m.trigger("orders", 2)
        m.complete("orders", 2)
        m.close()  # the old layout stops
    after = _layout(make_catalog, 3, tmp_path, "new")
    managers = [make_manager(c, storage, num_retained=2) for c in after]
    for m in managers:
        m.restore("orders", 2)

    for checkpoint_id in (3, 4):
        for m in managers:
            m.trigger("orders", checkpoint_id)
        for m in managers:
            m.complete("orders", checkpoint_id)
            assert m.drain_deletes(30)
        old_ids = {int(p.split("/")[1][4:]) for p in storage.list("orders") if "-of-2" in p}
        assert old_ids == ({2} if checkpoint_id == 3 else set())
    referenced = set()
    for path in storage.list("orders"):
        if "/_metadata." in path:
            m = _metadata(storage, path)
            referenced |= {h.under(path.rsplit("/", 1)[0]).path for h in m.shared_handles().values()}
    assert set(storage.list("orders/shared")) == referenced


def _metadata(storage, path):
    from statehouse.snapshots.metadata import SnapshotMetadata

    return SnapshotMetadata.from_bytes(storage.read(path), path)
