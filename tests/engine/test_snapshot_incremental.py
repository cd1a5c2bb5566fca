"""Incremental RocksDB checkpoints: upload only new SSTs, shared-state registry, retention."""

from __future__ import annotations

import json
import os

import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing.registry import SharedStateRegistry
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.snapshots.handles import StreamHandle
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.stored.descriptors import StateDescriptor
from tests.support.job_contents import dump


def test_registry_flink_vector_10():
    """File F: uploaded by 1, placeholder in 2, gone from 3; num-retained=1."""
    registry = SharedStateRegistry()
    f = StreamHandle("job/shared/F", 10, "x")
    registry.register_reference(f.path, f, 1)
    assert registry.unregister_unused(1) == []
    registry.register_reference(f.path, f, 2, placeholder=True)
    assert registry.unregister_unused(2) == []  # L=2, F.last_used=2: kept
    assert registry.entries()[f.path].created == 1
    assert registry.unregister_unused(3) == [f]  # checkpoint 3 does not use F: L=3 deletes it
    with pytest.raises(KeyError):
        registry.register_reference("job/shared/G", f, 4, placeholder=True)


def _write(job, start, count, size=300):
    with job.transaction() as tx:
        for i in range(start, start + count):
            tx.value("v").update(f"key-{i:06d}", os.urandom(size))  # incompressible, like real state


def _referenced(storage, job="orders"):
    """Shared files referenced by the retained checkpoints' metadata (read back from storage)."""
    refs = set()
    for path in storage.list(job):
        if "/_metadata." in path:
            body = json.loads(storage.read(path))["body"]
            directory = path.rsplit("/", 1)[0]
            for handle in body["keyed"].get("shared", {}).values():
                refs.add(StreamHandle.from_dict(handle).under(directory).path)
    return refs


@pytest.fixture
def rocks(tmp_path):
    catalog = JobCatalog(RocksDBStore(str(tmp_path / "data")))
    job, _ = catalog.create("orders", 128)
    job.register_state(StateDescriptor("v", "value"))
    yield catalog, job
    catalog.close()


def test_second_checkpoint_uploads_only_new_files(rocks, make_manager, tmp_path):
    catalog, job = rocks
    storage = open_storage(str(tmp_path / "cp"))
    manager = make_manager(catalog, storage, num_retained=2)
    for round_ in range(3):  # several SSTs: each freeze flushes the memtable into a new one
        _write(job, round_ * 4000, 4000)
        manager.trigger("orders", round_ + 1)
        manager.complete("orders", round_ + 1)
    first_total = sum(i.bytes_uploaded for i in manager.list("orders"))
    _write(job, 0, 10)  # a small change
    small = manager.trigger("orders", 4)
    small = manager.complete("orders", 4)
    assert small.format == "incremental"
    assert small.bytes_reused > 0.9 * first_total
    assert small.bytes_uploaded < 0.05 * first_total, (small.bytes_uploaded, first_total)
    assert manager.drain_deletes(30)
    shared = [p for p in storage.list("orders/shared")]
    assert set(shared) == _referenced(storage)

    expected = dump(job)
    _write(job, 50_000, 10)
    manager.restore("orders", 4)
    assert dump(catalog.get("orders")) == expected


def test_retention_deletes_exactly_unused_shared_files(rocks, make_manager, tmp_path):
    catalog, job = rocks
    storage = open_storage(str(tmp_path / "cp"))
    manager = make_manager(catalog, storage, num_retained=2)
    uploaded = set()
    for checkpoint_id in range(1, 7):
        _write(job, checkpoint_id * 1000, 1000)
        if checkpoint_id == 4:
            family = job.partition._families["v"]  # force a compaction: old SSTs leave the database
            family.compact_range(None, None)
        manager.trigger("orders", checkpoint_id)
        manager.complete("orders", checkpoint_id)
        assert manager.drain_deletes(30)
        uploaded |= set(storage.list("orders/shared"))
        shared = set(storage.list("orders/shared"))
        assert shared == _referenced(storage), f"after checkpoint {checkpoint_id}"
    assert len(uploaded) > len(shared), "compacted-away SSTs of subsumed checkpoints were deleted"
    chk_dirs = {p.split("/")[1] for p in storage.list("orders") if p.split("/")[1].startswith("chk-")}
    assert chk_dirs == {"chk-5", "chk-6"}


def test_registry_and_reuse_survive_restart(make_manager, tmp_path):
    data, cp = str(tmp_path / "data"), str(tmp_path / "cp")
    catalog = JobCatalog(RocksDBStore(data))
    job, _ = catalog.create("orders", 128)
    job.register_state(StateDescriptor("v", "value"))
    _write(job, 0, 3000)
    manager = make_manager(catalog, open_storage(cp))
    manager.trigger("orders", 1)
    first = manager.complete("orders", 1)
    manager.close()  # the process stops
    catalog.close()

    catalog = JobCatalog(RocksDBStore(data))  # a new process over the same disk and storage
    manager = make_manager(catalog, open_storage(cp))
    assert [(i.checkpoint_id, i.status) for i in manager.list("orders")] == [(1, "completed")]
    _write(catalog.get("orders"), 5000, 5)
    second = manager.complete("orders", manager.trigger("orders").checkpoint_id)
    assert second.checkpoint_id == 2
    assert second.bytes_reused >= first.bytes_uploaded * 0.5 and second.bytes_uploaded < first.bytes_uploaded
    expected = dump(catalog.get("orders"))
    manager.restore("orders", 2)
    assert dump(catalog.get("orders")) == expected
    catalog.close()


def test_the_options_file_is_uploaded_once_and_restores_from_a_later_checkpoint(rocks, make_manager, tmp_path):
    """RocksDB's options file keeps its name while its content stays (a change writes a new one):
    a later checkpoint of the same database reuses it as it reuses table files, and restores."""
    catalog, job = rocks
    storage = open_storage(str(tmp_path / "cp"))
    manager = make_manager(catalog, storage, num_retained=2)
    for checkpoint_id in (1, 2, 3):
        _write(job, checkpoint_id * 100, 100)
        manager.trigger("orders", checkpoint_id)
        manager.complete("orders", checkpoint_id)
    assert manager.drain_deletes(30)
    parts = {p: json.loads(storage.read(p))["body"]["keyed"] for p in storage.list("orders") if "/_metadata." in p}
    options = {n: h["path"] for body in parts.values() for n, h in body["shared"].items() if n.startswith("OPTIONS-")}
    assert len(options) == 1, parts
    assert not [n for body in parts.values() for n in body["private"] if n.startswith("OPTIONS-")]
    assert len([p for p in storage.list("orders/shared") if "OPTIONS-" in p]) == 1, "uploaded again"
    expected = dump(job)
    _write(job, 0, 10)
    manager.restore("orders", 3)
    assert dump(catalog.get("orders")) == expected
