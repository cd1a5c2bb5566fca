"""A restore builds the new job beside the live one and swaps it in: a failure at any step
(fetch, verify, build, swap) leaves the live job byte for byte as it was, and serving; a
write racing the swap lands before it or is refused; the writer epoch never goes back."""

from __future__ import annotations

import os
import threading
import time

import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing.manager import CheckpointManager
from statehouse.backends.errors import JobReplaced
from statehouse.backends.heap import HeapStore
from statehouse.backends.limits import Limits, TooManyStates
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.snapshots.errors import SnapshotCorrupt
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.stored.descriptors import StateDescriptor
from tests.support.job_contents import STATES, dump, operator_dump, populate


@pytest.fixture(
    params=[("heap", "full"), ("heap", "incremental"), ("rocksdb", "full"), ("rocksdb", "incremental")],
    ids="-".join,
)
def layout(request):
    """A backend and the kind of its checkpoints (incremental: RocksDB's, or the heap's changelog)."""
    return request.param


@pytest.fixture
def backend(layout):
    """The backend of :func:`layout` (the catalogs :func:`make_catalog` opens)."""
    return layout[0]


@pytest.fixture
def setup(layout, make_catalog, make_manager, tmp_path):
    """A job with a completed checkpoint 1, then changed after it (so a restore is visible)."""
    catalog = make_catalog(incremental=layout[1] == "incremental")
    job, _ = catalog.create("orders", 128)
    populate(job, 120)
    manager = make_manager(catalog, open_storage(str(tmp_path / "checkpoints")))
    manager.trigger("orders", 1)
    manager.complete("orders", 1)
    checkpointed = dump(job)
    with job.transaction() as tx:
        tx.value("v").update("k1", "after the checkpoint")
        for key in ("k1", "k2", "k3"):  # TTL reads leave an incremental-cleanup cursor open
            tx.value("t").get(key)
    job.fence(7)
    return catalog, manager, checkpointed


def snapshot_of(job):
    return dump(job), operator_dump(job), dict(job.descriptors), job.epoch


def assert_serving(catalog):
    job = catalog.get("orders")
    with job.transaction() as tx:
        tx.value("v").update("probe", 1)
    with job.transaction() as tx:
        assert tx.value("v").get("probe") == 1


def fail(*_args, **_kwargs):
    raise OSError("injected failure")


def test_restore_swaps_in_the_checkpoint_and_advances_the_epoch(setup):
    catalog, manager, checkpointed = setup
    before = catalog.get("orders")
    manager.restore("orders", 1)
    after = catalog.get("orders")
    assert after is not before and dump(after) == checkpointed
    # The snapshot was taken at epoch 0; the live job was at 7. Never backwards, and one past
    # the live epoch: attempts of the running epoch wrote against the replaced state.
    assert after.epoch == 8
    # A request that still holds the old job is refused (and retries), never lost into it.
    with pytest.raises(JobReplaced), before.transaction() as tx:
        tx.value("v").update("k1", "lost?")
    assert dump(after) == checkpointed
    assert_serving(catalog)


@pytest.mark.slow
@pytest.mark.parametrize(
    "step",
    ["download", "fetch", "build", "verify", "quiesce", "promote"],
)
def test_a_failing_step_leaves_the_live_job_as_it_was(setup, monkeypatch, step):
    catalog, manager, _checkpointed = setup
    live = catalog.get("orders")
    before = snapshot_of(live)
    if step == "download":  # every read of snapshot bytes after the metadata: ranged, whole, file
        monkeypatch.setattr("statehouse.snapshots.storage.base.CheckpointStorage.download_verified", fail)
    target = {
        "download": ("statehouse.snapshots.storage.base.CheckpointStorage.read_existing", fail),
        "fetch": ("statehouse.backends.snapshot.restore.fetch_key_groups", fail),
        "build": ("statehouse.backends.base.partition.StorePartition.load", fail),
        "verify": ("statehouse.backends.checkpointing.restore.stored_descriptors", lambda _p: {}),
        "quiesce": ("statehouse.backends.checkpointing.manager.CheckpointManager._quiesce", fail),
        "promote": (f"{type(catalog.store).__module__}.{type(catalog.store).__name__}.promote", fail),
    }[step]
    monkeypatch.setattr(*target)
    if step == "fetch" and manager.get("orders", 1).format == "incremental":
        target = (
            "statehouse.snapshots.incremental.IncrementalPartReader.entries",
            fail,
        )  # the full-format reader is unused
        monkeypatch.setattr(*target)
    if step == "fetch" and manager.get("orders", 1).format == "changelog":  # its base and deltas, each
        monkeypatch.setattr("statehouse.snapshots.changelog.fetch_restrictions", fail)
    with pytest.raises((OSError, SnapshotCorrupt)):
        manager.restore("orders", 1)
    assert catalog.get("orders") is live
    assert snapshot_of(live) == before
    assert_serving(catalog)
    staging = os.path.join(getattr(catalog.store, "data_dir", "/nonexistent"), "$staging", "orders")
    assert not os.path.exists(staging)  # the half-built job is gone


def wait_until(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_writes_racing_a_restore_land_before_it_or_are_refused(setup):
    """A writer that keeps its job (a request that looked it up before the swap) and retries
    with a fresh lookup when refused: no write is acknowledged by the old job after the new
    one took over, and the new job holds the last write it acknowledged."""
    catalog, manager, _checkpointed = setup
    acked: list[tuple[object, int]] = []
    refused = []
    stop = threading.Event()

    def writer() -> None:
        job, i = catalog.get("orders"), 0
        while not stop.is_set():
            i += 1
            try:
                with job.transaction() as tx:
                    tx.value("v").update("racer", i)
                acked.append((job, i))
            except JobReplaced:
                refused.append(i)
                job = catalog.get("orders")

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_until(lambda: len(acked) >= 50)
        manager.restore("orders", 1)
        new = catalog.get("orders")
        wait_until(lambda: sum(1 for job, _ in acked if job is new) >= 50)
    finally:
        stop.set()
        thread.join(10)
    on_old = [i for job, i in acked if job is not new]
    on_new = [i for job, i in acked if job is new]
    assert on_old and on_new and refused  # the writer did race the swap
    assert max(on_old) < min(on_new)  # the old job acknowledged nothing after the swap
    with new.transaction() as tx:
        assert tx.value("v").get("racer") == max(on_new)


def test_rocksdb_swap_rolls_back_when_the_new_database_cannot_open(make_manager, tmp_path, monkeypatch):
    """Failing inside the directory swap itself (after the live database was closed)."""
    catalog = JobCatalog(RocksDBStore(str(tmp_path / "data")))
    job, _ = catalog.create("orders", 128)
    populate(job, 50)
    manager = make_manager(catalog, open_storage(str(tmp_path / "checkpoints")))
    manager.trigger("orders", 1)
    manager.complete("orders", 1)
    with job.transaction() as tx:
        tx.value("v").update("k1", "live")
    before = snapshot_of(job)
    reopen = type(job.partition).reopen
    calls = []

    def reopen_failing_once(partition):
        calls.append(partition.path)
        if len(calls) == 1:
            raise OSError("injected: the restored database does not open")
        reopen(partition)

    monkeypatch.setattr(type(job.partition), "reopen", reopen_failing_once)
    with pytest.raises(OSError, match="injected"):
        manager.restore("orders", 1)
    assert len(calls) == 2  # tried the new database, then reopened the old one
    assert catalog.get("orders") is job and snapshot_of(job) == before
    assert_serving(catalog)
    data = tmp_path / "data"
    assert not os.path.exists(data / "$staging" / "orders") and not os.path.exists(data / "$retired" / "orders")
    catalog.close()


def _heap_savepoint(storage, states: list[str]) -> None:
    """A heap deployment's savepoint of job "orders" holding ``states``, one entry each."""
    heap = JobCatalog(HeapStore())
    source, _ = heap.create("orders", 128)
    for name in states:
        source.register_state(StateDescriptor(name, "value"))
        with source.transaction() as tx:
            tx.value(name).update("k", name)
    saver = CheckpointManager(heap, storage)
    saver.trigger("orders", 1, kind="savepoint")
    saver.complete("orders", 1)
    saver.close()  # the heap deployment stops


def test_a_state_named_default_restores_into_rocksdb(make_manager, tmp_path):
    """RocksDB's own column family is "default": a heap savepoint's state of that name gets
    another column family (it used to fail the restore)."""
    storage = open_storage(str(tmp_path / "checkpoints"))
    _heap_savepoint(storage, ["default", "other"])
    rocks = JobCatalog(RocksDBStore(str(tmp_path / "data")))
    live, _ = rocks.create("orders", 128)
    populate(live, 10)
    make_manager(rocks, storage).restore("orders", 1)
    restored = rocks.get("orders")
    with restored.transaction() as tx:
        assert tx.value("default").get("k") == "default" and tx.value("other").get("k") == "other"
    rocks.close()


def test_a_build_refused_by_the_engine_leaves_the_job(make_manager, tmp_path):
    """A savepoint with more keyed states than the limit: the restore fails (too_many_states),
    the live job keeps its states and data (a failed restore used to leave it empty)."""
    storage = open_storage(str(tmp_path / "checkpoints"))
    _heap_savepoint(storage, ["default", *(f"s{i}" for i in range(len(STATES)))])
    rocks = JobCatalog(RocksDBStore(str(tmp_path / "data")), limits=Limits(max_states_per_job=len(STATES)))
    live, _ = rocks.create("orders", 128)
    populate(live, 40)
    before = snapshot_of(live)
    manager = make_manager(rocks, storage)
    with pytest.raises(TooManyStates):
        manager.restore("orders", 1)
    assert rocks.get("orders") is live and snapshot_of(live) == before
    assert_serving(rocks)
    rocks.close()


def test_restart_after_a_crash_mid_swap_keeps_one_whole_job(tmp_path):
    data = tmp_path / "data"
    catalog = JobCatalog(RocksDBStore(str(data)))
    job, _ = catalog.create("orders", 128)
    populate(job, 30)
    expected = dump(job)
    catalog.close()
    # Crashed after moving the live directory aside, before moving the new one in.
    os.makedirs(data / "$retired")
    os.rename(data / "orders", data / "$retired" / "orders")
    os.makedirs(data / "$staging" / "orders")
    reopened = JobCatalog(RocksDBStore(str(data)))
    assert dump(reopened.get("orders")) == expected
    assert not os.listdir(data / "$retired") and not os.path.exists(data / "$staging")
    reopened.close()
