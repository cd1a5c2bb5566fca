"""Lifecycle guarantees: asynchronous uploads, corrupt files refused, survival across a restart."""

from __future__ import annotations

import os
import threading

import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing.cleaner import CheckpointCleaner
from statehouse.backends.heap import HeapStore
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.snapshots.errors import CheckpointNotReady, SnapshotCorrupt
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.storage.local import LocalStorage
from tests.support.gated import NextUpload, gated
from tests.support.job_contents import dump, populate


def test_writes_after_trigger_are_not_blocked_nor_snapshotted(make_catalog, make_manager, tmp_path):
    catalog = make_catalog()
    job, _ = catalog.create("orders", 128)
    populate(job, 100)
    expected = dump(job)
    storage = gated(LocalStorage, str(tmp_path / "cp"))  # every write but the metadata waits
    manager = make_manager(catalog, storage, complete_timeout_s=0.2)

    assert manager.trigger("orders", 1).status == "in_progress"
    with job.transaction() as tx:  # the upload is stuck until the gate opens: these end only if writes go on
        for i in range(200):
            tx.value("v").update(f"k{i}", "after")
        tx.value("v").update("late", 1)
    assert manager.get("orders", 1).status == "in_progress"
    with pytest.raises(CheckpointNotReady):
        manager.complete("orders", 1)

    storage.gate.set()
    assert manager.wait("orders", 1, 30).status == "uploaded"
    manager.complete("orders", 1)
    manager.restore("orders", 1)
    assert dump(catalog.get("orders")) == expected


@pytest.mark.parametrize("victim", ["keyed.bin", "operator.bin", "_metadata", ".sst", "-heap-base"])
def test_corrupt_file_is_refused_and_state_kept(make_manager, tmp_path, victim):
    # SST files exist only in incremental (RocksDB) checkpoints, a changelog's base in the heap's;
    # the others are tested on the heap backend's full format.
    if victim == ".sst":
        catalog = JobCatalog(RocksDBStore(str(tmp_path / "data")))
    else:
        catalog = JobCatalog(HeapStore(incremental_checkpoints=victim == "-heap-base"))
    job, _ = catalog.create("orders", 128)
    populate(job, 100)
    storage = open_storage(str(tmp_path / "cp"))
    manager = make_manager(catalog, storage)
    manager.trigger("orders", 1)
    manager.complete("orders", 1)
    path = next(p for p in storage.list("orders") if victim in p)
    full = os.path.join(storage.root, path)
    with open(full, "r+b") as f:
        f.seek(os.path.getsize(full) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with job.transaction() as tx:
        tx.value("v").update("k1", "live")
    with pytest.raises(SnapshotCorrupt, match=r"corrupt|checksum"):
        manager.restore("orders", 1)
    with catalog.get("orders").transaction() as tx:  # nothing was touched
        assert tx.value("v").get("k1") == "live"
    catalog.close()


def test_partial_restore_checks_its_sections(make_manager, tmp_path):
    storage = open_storage(str(tmp_path / "cp"))
    catalog = JobCatalog(HeapStore(incremental_checkpoints=False))
    populate(catalog.create("orders", 128)[0], 200)
    manager = make_manager(catalog, storage)
    manager.trigger("orders", 1)
    manager.complete("orders", 1)
    path = os.path.join(storage.root, "orders/chk-1/replica-0-of-1/keyed.bin")
    with open(path, "r+b") as f:
        f.seek(-3, os.SEEK_END)  # inside the last key group: replica 1 of 2 reads it, replica 0 does not
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    make_manager(JobCatalog(HeapStore(), replica_index=0, replica_count=2), storage).restore("orders", 1)
    with pytest.raises(SnapshotCorrupt, match="key group 127"):
        make_manager(JobCatalog(HeapStore(), replica_index=1, replica_count=2), storage).restore("orders", 1)


def test_completed_checkpoint_survives_the_process(make_catalog, make_manager, tmp_path):
    location = str(tmp_path / "cp")
    catalog = make_catalog(data_dir=tmp_path / "a")
    job, _ = catalog.create("orders", 128)
    populate(job, 150)
    expected = dump(job)
    manager = make_manager(catalog, open_storage(location), num_retained=2)
    for checkpoint_id in (1, 2, 3):
        manager.trigger("orders", checkpoint_id)
        manager.complete("orders", checkpoint_id)
    manager.trigger("orders", 4)  # never completed: a crash loses it
    manager.wait("orders", 4, 30)
    manager.close()  # the process stops

    fresh = make_catalog(data_dir=tmp_path / "b")  # a new process, empty local state
    restarted = make_manager(fresh, open_storage(location), num_retained=2)
    assert [(i.checkpoint_id, i.status) for i in restarted.list("orders")] == [(2, "completed"), (3, "completed")]
    info = restarted.restore("orders")  # the latest completed checkpoint
    assert info.checkpoint_id == 3
    assert dump(fresh.get("orders")) == expected
    assert restarted.trigger("orders").checkpoint_id == 5  # ids keep increasing past the lost attempt


class _CountingStorage(LocalStorage):
    """Local storage that counts its listings and deletes (each a request on S3)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.lists = self.deletes = 0

    def list(self, prefix: str) -> list[str]:
        self.lists += 1
        return super().list(prefix)

    def delete(self, paths) -> None:
        self.deletes += 1
        super().delete(paths)


def test_retention_deletes_a_subsumed_part_whole_without_listing_it(make_catalog, make_manager, tmp_path):
    """A checkpoint after every micro-batch subsumes one each time: its metadata goes first, then
    its files (named by that metadata) with the shared files no retained checkpoint uses, in one
    more request; nothing of it is left, and the retained ones still restore."""
    catalog = make_catalog()
    job, _ = catalog.create("orders", 128)
    storage = _CountingStorage(str(tmp_path / "cp"))
    manager = make_manager(catalog, storage, num_retained=2)
    for checkpoint_id in (1, 2):
        populate(job, 50 * checkpoint_id)
        manager.trigger("orders", checkpoint_id)
        manager.complete("orders", checkpoint_id)
    kept = set(storage.list("orders/chk-2"))
    for checkpoint_id in (3, 4):
        populate(job, 50 * checkpoint_id)
        expected = dump(job)
        manager.trigger("orders", checkpoint_id)
        storage.lists = storage.deletes = 0
        manager.complete("orders", checkpoint_id)
        assert manager.drain_deletes(30)
        assert (storage.lists, storage.deletes) == (0, 2), f"checkpoint {checkpoint_id}"
        assert not storage.list(f"orders/chk-{checkpoint_id - 2}"), "a subsumed part left files"
    assert not os.path.exists(tmp_path / "cp" / "orders" / "chk-1"), "an emptied checkpoint directory stayed"
    assert not kept & set(storage.list("orders")), "checkpoint 2's own files outlived it"
    manager.restore("orders", 4)
    assert dump(catalog.get("orders")) == expected


class _HeldDeletes(LocalStorage):
    """Local storage whose deletes wait until :attr:`go` is set (S3's slow requests, held)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.go = threading.Event()

    def delete(self, paths) -> None:
        self.go.wait(30)
        super().delete(paths)


def test_a_completion_answers_before_retention_deletes_what_it_subsumed(make_catalog, make_manager, tmp_path):
    """Flink's checkpoint cleaner: the deletes of what a completion subsumes run after it answers,
    in the background, so a micro-batch's checkpoint does not wait for them; the subsumed part is
    gone once they ran, and a restarted manager lists what was retained."""
    catalog = make_catalog()
    job, _ = catalog.create("orders", 128)
    storage = _HeldDeletes(str(tmp_path / "cp"))
    manager = make_manager(catalog, storage, num_retained=1)
    populate(job, 50)
    manager.trigger("orders", 1)
    manager.complete("orders", 1)
    populate(job, 100)
    manager.trigger("orders", 2)
    assert manager.complete("orders", 2).status == "completed"
    assert storage.list("orders/chk-1"), "the completion waited for its deletes"
    # A listing of storage waits for them: it never shows a part already subsumed.
    listings: list[list[int]] = []
    lister = threading.Thread(
        target=lambda: listings.append([i.checkpoint_id for i in manager.list("orders", every_layout=True)])
    )
    lister.start()
    lister.join(0.3)
    assert lister.is_alive() and not listings, "listed before the deletes ran"
    storage.go.set()
    lister.join(30)
    assert listings == [[2]]
    assert manager.drain_deletes(30)
    assert not storage.list("orders/chk-1"), "the subsumed part outlived its deletes"
    manager.close()
    restarted = make_manager(make_catalog(data_dir=tmp_path / "b"), storage, num_retained=1)
    assert [i.checkpoint_id for i in restarted.list("orders")] == [2]


def test_a_live_rescales_checkpoint_outlives_a_newer_one_that_completes_first(make_manager, tmp_path):
    """A move's checkpoint of a small job may still be uploading when the query's next checkpoint
    completes (the replica busy with a big job's upload): it is not subsumed, the shared files it
    reuses stay through the newer one's retention, and it completes and restores what it froze."""
    catalog = JobCatalog(RocksDBStore(str(tmp_path / "data")))
    job, _ = catalog.create("orders", 128)
    populate(job, 200)
    next_upload = NextUpload()
    storage = gated(LocalStorage, str(tmp_path / "cp"), gates=next_upload)
    manager = make_manager(catalog, storage, num_retained=1)
    manager.trigger("orders", 1)
    manager.complete("orders", 1)
    populate(job, 300, tag="frozen for the move")
    expected = dump(job)

    manager.hold_for(5)  # the move to topology version 5 is pending here
    next_upload.arm()
    manager.trigger("orders", 2, metadata={"rescale_version": 5})
    assert next_upload.holding.wait(30)
    populate(job, 300, tag="after")
    job.partition.compact_key_groups(list(job.partition.tables()), [job.key_group_range], force=True)
    manager.trigger("orders", 3)  # the query's: shares no file with checkpoint 1 after the compaction
    manager.complete("orders", 3)
    assert manager.get("orders", 2).status == "in_progress"

    storage.gate.set()
    assert manager.wait("orders", 2, 30).status == "uploaded"
    manager.complete("orders", 2)
    assert [(i.checkpoint_id, i.status) for i in manager.list("orders")] == [(2, "completed"), (3, "completed")]
    fresh = JobCatalog(RocksDBStore(str(tmp_path / "fresh")))
    make_manager(fresh, storage).restore("orders", 2)
    assert dump(fresh.get("orders")) == expected
    fresh.close()


@pytest.mark.parametrize("store", ["rocksdb", "heap"])
def test_a_completion_does_not_subsume_a_checkpoint_that_is_completing(make_manager, tmp_path, store):
    """Two checkpoints of a job complete at once on a replica (a query's and a live rescale's): the
    newer one's completion aborts older pending ones (Flink's subsumption), but not one halfway
    through its own completion, whose files it would delete under the metadata being written.
    The completions of a job's checkpoints take turns; the older one completes and restores."""
    catalog = JobCatalog(RocksDBStore(str(tmp_path / "data")) if store == "rocksdb" else HeapStore())
    job, _ = catalog.create("orders", 128)
    populate(job, 200, tag="one")
    storage = gated(LocalStorage, str(tmp_path / "cp"), gates=lambda path: "chk-1/" in path and "_metadata" in path)
    manager = make_manager(catalog, storage, num_retained=2)
    manager.trigger("orders", 1)
    assert manager.wait("orders", 1, 30).status == "uploaded"
    expected = dump(job)
    populate(job, 300, tag="two")
    manager.trigger("orders", 2)
    assert manager.wait("orders", 2, 30).status == "uploaded"

    first = threading.Thread(target=manager.complete, args=("orders", 1))
    first.start()  # held writing its metadata: halfway through its completion
    second = threading.Thread(target=manager.complete, args=("orders", 2))
    second.start()
    second.join(0.5)
    assert second.is_alive(), "checkpoint 2 completed while checkpoint 1 was completing"
    storage.gate.set()
    first.join(30)
    second.join(30)
    assert [(i.checkpoint_id, i.status) for i in manager.list("orders")] == [(1, "completed"), (2, "completed")]
    manager.restore("orders", 1)
    assert dump(catalog.get("orders")) == expected
    catalog.close()


def test_the_cleaner_deletes_in_order_and_at_once_once_closed():
    """Deletes handed to the cleaner run one after another, in the order given; once it is closed
    (the replica stopping), what is handed over runs at once, in the caller's thread."""
    cleaner = CheckpointCleaner()
    ran: list[tuple[int, str]] = []
    for i in range(20):
        cleaner.submit(lambda i=i: ran.append((i, threading.current_thread().name)))
    assert cleaner.drain(30)
    assert [i for i, _ in ran] == list(range(20))
    assert all(name.startswith("checkpoint-cleaner") for _, name in ran)
    cleaner.close()
    cleaner.submit(lambda: ran.append((20, threading.current_thread().name)))
    assert ran[-1] == (20, threading.current_thread().name)
    assert cleaner.drain(0)
