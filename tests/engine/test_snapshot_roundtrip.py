"""Checkpoint → restore round trips on both backends, local and in-memory storage."""

from __future__ import annotations

import uuid

import pytest

from statehouse.snapshots.errors import CheckpointConflict, CheckpointNotFound
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.ttl import TtlConfig
from tests.support.job_contents import dump, operator_dump, populate


@pytest.fixture(params=["local", "memory"])
def storage(request, tmp_path):
    if request.param == "local":
        return open_storage(str(tmp_path / "checkpoints"))
    return open_storage(f"memory://{uuid.uuid4().hex}/root")


@pytest.mark.parametrize("incremental", [True, False])
def test_round_trip(make_catalog, make_manager, storage, incremental):
    catalog = make_catalog(incremental=incremental)
    job, _ = catalog.create("orders", 128)
    populate(job)
    expected, expected_ops = dump(job), operator_dump(job)
    manager = make_manager(catalog, storage)

    info = manager.trigger("orders")
    assert info.checkpoint_id == 1 and info.status == "in_progress"
    assert manager.wait("orders", 1, 30).status == "uploaded"
    done = manager.complete("orders", 1)
    assert done.status == "completed"
    expected_format = {"rocksdb": "incremental", "heap": "changelog"}[catalog.store.name] if incremental else "full"
    assert done.format == expected_format

    with job.transaction() as tx:  # changes after the checkpoint are undone by the restore
        tx.value("v").update("k1", "changed")
        tx.value("v").update("new-key", 1)
    restored = manager.restore("orders", 1)
    assert restored.entries_restored > 0 and restored.parts == ["replica-0-of-1"]
    job = catalog.get("orders")
    assert dump(job) == expected
    assert operator_dump(job) == expected_ops
    with job.transaction() as tx:
        assert tx.value("v").get("k1") == {"n": "k1", "tag": ""}
        assert tx.value("v").get("new-key") is None
        assert tx.map("m").get_all("k3") == {"a": 1, "b": ["k3", ""]}
        assert tx.operator.list_get("src", 0, "offsets") == [0, ""]
        assert tx.operator.broadcast_get("rules", "cfg", "limit") == 10
    assert job.descriptor("t").ttl.ttl_ms == 1_000


def test_ids_lifecycle_and_errors(make_catalog, make_manager, storage):
    catalog = make_catalog()
    job, _ = catalog.create("j", 128)
    populate(job, 20)
    manager = make_manager(catalog, storage)
    manager.trigger("j", 5)
    with pytest.raises(CheckpointConflict):
        manager.trigger("j", 5)
    with pytest.raises(CheckpointConflict):
        manager.trigger("j", 3)
    manager.complete("j", 5)
    assert manager.complete("j", 5).status == "completed"  # repeated notifications are harmless
    assert manager.trigger("j").checkpoint_id == 6
    assert manager.abort("j", 6).status == "aborted"
    with pytest.raises(CheckpointConflict):
        manager.abort("j", 5)
    with pytest.raises(CheckpointNotFound):
        manager.get("j", 99)
    assert [(i.checkpoint_id, i.status) for i in manager.list("j")] == [(5, "completed"), (6, "aborted")]


def test_ttl_expired_data_is_not_in_full_snapshot(make_catalog, make_manager, storage, clock):
    catalog = make_catalog(incremental=False)
    job, _ = catalog.create("j", 128)
    job.register_state(StateDescriptor("t", "value", ttl=TtlConfig(100, cleanup_incremental_size=0)))
    with job.transaction() as tx:
        tx.value("t").update("old", 1)
    clock.advance(60)
    with job.transaction() as tx:
        tx.value("t").update("young", 2)
    clock.advance(50)  # "old" expired, "young" not
    manager = make_manager(catalog, storage)
    manager.trigger("j", 1, kind="savepoint")
    manager.complete("j", 1)
    manager.restore("j", 1)
    stored = [key for key in dump(catalog.get("j")) if key[0] == "t"]
    assert len(stored) == 1 and b"young" in stored[0][2]  # "old" was dropped on write
