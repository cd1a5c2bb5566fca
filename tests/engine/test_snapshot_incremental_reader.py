"""The one reader of incremental parts (``statehouse.snapshots.incremental``), which the server's
restore and the Spark data source share: it downloads only the files that can hold the wanted key
groups, reads exactly their entries, and refuses a database whose max parallelism is not the
metadata's. Real RocksDB checkpoints in local storage."""

from __future__ import annotations

import dataclasses
import os

import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.heap import HeapStore
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.backends.rocksdb.partition import RocksDBPartition
from statehouse.backends.snapshot.restore import part_reader
from statehouse.protocol.keygroups import KeyGroupRange, assign_to_key_group
from statehouse.snapshots.catalog import find_snapshot, read_parts
from statehouse.snapshots.errors import CheckpointNotFound, SnapshotCorrupt
from statehouse.snapshots.handles import IncrementalHandle
from statehouse.snapshots.incremental import IncrementalPartReader
from statehouse.snapshots.metadata import SnapshotPart
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.stored.codec import encode_primary
from statehouse.snapshots.stored.descriptors import StateDescriptor
from tests.support.job_contents import dump

P = 128
LOW, HIGH = KeyGroupRange(0, 31), KeyGroupRange(96, 127)


def keys_in(key_groups: KeyGroupRange, n: int) -> list[str]:
    """``n`` string keys whose key groups are in ``key_groups``."""
    found: list[str] = []
    i = 0
    while len(found) < n:
        key = f"key-{i}"
        if assign_to_key_group(key, "string", P) in key_groups:
            found.append(key)
        i += 1
    return found


@pytest.fixture
def checkpointed(tmp_path, make_manager):
    """A RocksDB job checkpointed twice, incrementally: the first checkpoint's memtable flush
    holds only ``LOW``'s keys, the second's only ``HIGH``'s, so each table file spans one of them.
    Yields the storage, the second checkpoint's part and the job's keys by range."""
    catalog = JobCatalog(RocksDBStore(str(tmp_path / "data")))
    job, _ = catalog.create("orders", P)
    job.register_state(StateDescriptor("v", "value"))
    storage = open_storage(str(tmp_path / "cp"))
    manager = make_manager(catalog, storage, num_retained=2)
    keys = {LOW: keys_in(LOW, 300), HIGH: keys_in(HIGH, 300)}
    for checkpoint, kg_range in enumerate((LOW, HIGH), start=1):
        with job.transaction() as tx:
            for key in keys[kg_range]:
                tx.value("v").update(key, f"{key}={checkpoint}")
        manager.trigger("orders", checkpoint)
        assert manager.complete("orders", checkpoint).format == "incremental"
    expected = dump(job)
    (part,) = read_parts(storage, find_snapshot(storage, "orders", 2))
    yield storage, part, keys, expected
    catalog.close()


def primary(key: str) -> bytes:
    """A value state's stored primary of ``key`` (the default namespace)."""
    return encode_primary(key, "string", "")


def handle_of(part: SnapshotPart) -> IncrementalHandle:
    assert isinstance(part.metadata.keyed, IncrementalHandle)
    return part.metadata.keyed


def test_a_named_checkpoint_is_found_from_its_own_directory_not_from_every_file_of_the_job(checkpointed, monkeypatch):
    """Finding checkpoint N lists its directory (and the savepoint's when it is none), not every
    file of the job: the shared table files of a large state are most of those, and a live
    rescale's load and decision ask inside the frozen window. A directory without a completed
    part's metadata is no checkpoint; the latest needs every file."""
    storage, _part, _keys, _expected = checkpointed
    with storage.create_output("orders/chk-7/replica-0-of-1/MANIFEST-000001") as out:
        out.write(b"an upload that never completed")
    listed: list[str] = []
    listing = storage.list
    monkeypatch.setattr(storage, "list", lambda prefix: listed.append(prefix) or listing(prefix))
    assert find_snapshot(storage, "orders", 2) == "orders/chk-2"
    assert listed == ["orders/chk-2"]
    for missing in (7, 9):
        listed.clear()
        with pytest.raises(CheckpointNotFound, match=f"no completed checkpoint or savepoint {missing} "):
            find_snapshot(storage, "orders", missing)
        assert listed == [f"orders/chk-{missing}", f"orders/savepoints/sp-{missing}"]
    listed.clear()
    assert find_snapshot(storage, "orders", None) == "orders/chk-2"
    assert listed == ["orders"]


def test_a_read_of_some_key_groups_downloads_only_the_files_that_hold_them(checkpointed, tmp_path):
    storage, part, keys, _expected = checkpointed
    handle = handle_of(part)
    spans = {name: span for name, span in handle.spans.items() if span[0] == "v"}
    low_files = [n for n, (_t, first, last) in spans.items() if first <= LOW.end and last >= LOW.start]
    high_files = [n for n, (_t, first, last) in spans.items() if first <= HIGH.end and last >= HIGH.start]
    assert low_files and high_files and not set(low_files) & set(high_files)

    directory = tmp_path / "read"
    directory.mkdir()
    with IncrementalPartReader.download(storage, part, LOW, str(directory)) as reader:
        present = set(os.listdir(directory))
        assert set(low_files) <= present and not set(high_files) & present
        records = list(reader.records("v"))
    wanted = sorted(primary(k) for k in keys[LOW])
    assert sorted(r[1] for r in records) == wanted
    assert all(kg in LOW for kg, *_ in records)
    assert [r[:2] for r in records] == sorted(r[:2] for r in records)  # key group, then key order


def test_every_key_group_of_the_part_reads_back_whole(checkpointed, tmp_path):
    storage, part, keys, _expected = checkpointed
    with IncrementalPartReader.download(storage, part, KeyGroupRange(0, P - 1), str(tmp_path)) as reader:
        assert reader.tables() == {"v": False}
        records = list(reader.records("v"))
        assert len(records) == len(keys[LOW]) + len(keys[HIGH])
        # The same records as columns, in chunks (what the data source reads a table from).
        chunks = list(reader.table_records("v", 100))
        assert len(chunks) == -(-len(records) // 100)
        as_rows = [
            row
            for groups, primaries, secondaries, values in chunks
            for row in zip(list(groups), primaries.to_pylist(), secondaries.to_pylist(), values, strict=True)
        ]
        assert as_rows == records
        assert list(reader.table_records("no-such-table", 100)) == []
        assert list(reader.records("no-such-table")) == []


def test_a_database_whose_max_parallelism_differs_from_the_metadata_is_refused(checkpointed, tmp_path):
    storage, part, _keys, _expected = checkpointed
    lying = SnapshotPart(part.directory, dataclasses.replace(part.metadata, max_parallelism=256))
    reader = IncrementalPartReader.download(storage, lying, LOW, str(tmp_path))
    with pytest.raises(SnapshotCorrupt, match="max parallelism"), reader:
        pass


def test_a_full_handle_is_not_read_as_an_incremental_part(checkpointed, tmp_path, make_manager):
    storage, part, _keys, _expected = checkpointed
    mislabelled = SnapshotPart(part.directory, dataclasses.replace(part.metadata, format="full"))
    with pytest.raises(SnapshotCorrupt, match="no full handle"):
        part_reader(mislabelled).fetch(storage, mislabelled, LOW, str(tmp_path))


def test_the_restore_reads_incremental_parts_through_it_into_either_backend(checkpointed, tmp_path, make_manager):
    """The backend's part reader (what the restore loads) yields the shared reader's records, and a
    heap replica restores a RocksDB incremental checkpoint whole."""
    storage, part, keys, expected = checkpointed
    fetched = part_reader(part).fetch(storage, part, HIGH, str(tmp_path))
    try:
        ops = list(fetched.records())
    finally:
        fetched.release()
    assert {op.primary for op in ops} == {primary(k) for k in keys[HIGH]}
    assert all(op.kind == "put" and op.table == "v" and op.key_group in HIGH for op in ops)
    assert not [p for p in os.listdir(tmp_path) if p.startswith("part-")]  # released: its directory is gone

    heap = JobCatalog(HeapStore())
    try:
        make_manager(heap, storage).restore("orders", 2)
        assert dump(heap.get("orders")) == expected
    finally:
        heap.close()


def test_the_data_source_reads_the_same_records(checkpointed):
    pytest.importorskip("pyspark")
    from statehouse.client.datasource.checkpoint import part_records

    storage, part, keys, _expected = checkpointed
    stored = list(part_records(storage, part, "v", KeyGroupRange(100, 110)))
    wanted = {primary(k) for k in keys[HIGH] if assign_to_key_group(k, "string", P) in range(100, 111)}
    assert {p for _groups, primaries, _s, _v in stored for p in primaries.to_pylist()} == wanted
    assert list(part_records(storage, part, "no-such-state", HIGH)) == []


@pytest.mark.parametrize("rewritten", [True, False], ids=["rewritten", "as-ingested"])
def test_a_part_holding_files_a_restore_ingested_reads_some_key_groups_exactly(
    checkpointed, tmp_path, make_manager, monkeypatch, rewritten
):
    """A RocksDB restore ingests table files, which name no column family until a compaction
    rewrites them; RocksDB's repair (what opens a partly downloaded part) sets such a file aside.
    Replica 0 of 2 restores (ingesting ``LOW``'s keys), then writes keys of 32-63, flushed into a
    file of their own by the next checkpoint: a read of ``LOW`` from it skips that file. The load
    rewrites what it ingested, so the read downloads only ``LOW``'s files; files left as ingested
    (a replica stopped between the two) make it download the whole part instead. Either way it
    reads exactly those key groups."""
    storage, _part, keys, _expected = checkpointed
    if not rewritten:
        monkeypatch.setattr(RocksDBPartition, "compact_key_groups", lambda *_a, **_k: None)
    catalog = JobCatalog(RocksDBStore(str(tmp_path / "restored")), replica_index=0, replica_count=2)
    try:
        manager = make_manager(catalog, storage, num_retained=3)
        manager.restore("orders", 2)
        job = catalog.get("orders")
        with job.transaction() as tx:
            for key in keys_in(KeyGroupRange(32, 63), 100):
                tx.value("v").update(key, "new")
        manager.trigger("orders", 3)
        assert manager.complete("orders", 3).format == "incremental"
        (part,) = read_parts(storage, find_snapshot(storage, "orders", 3))
        handle = handle_of(part)
        skipped = {n for n, (_t, first, _last) in handle.spans.items() if first > LOW.end}
        assert skipped  # a file a read of LOW need not download
        directory = tmp_path / "read"
        directory.mkdir()
        with IncrementalPartReader.download(storage, part, LOW, str(directory)) as reader:
            downloaded = set(os.listdir(directory))
            records = list(reader.records("v"))
        assert bool(skipped & downloaded) is not rewritten
        assert sorted(r[1] for r in records) == sorted(primary(k) for k in keys[LOW])
        assert all(kg in LOW for kg, *_ in records)
    finally:
        catalog.close()
