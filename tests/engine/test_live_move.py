"""The engine's primitives of a live rescale (docs/rescale.md, "Engine API"), in process, both backends:
freezing the key groups that move (writes refused through every door, reads served), switching
a job's layout, dropping key groups, and merge-restoring moving-in key groups into live jobs."""

from __future__ import annotations

import itertools
import threading
import tracemalloc

import pyarrow as pa
import pytest

import statehouse.backends.base.partition as partition_module
import statehouse.backends.rocksdb.partition as rocksdb_partition
from statehouse.backends.attempts import advance, commit, perform, prepare
from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing import restore
from statehouse.backends.checkpointing.restore import MergeRestore
from statehouse.backends.columns import ColumnOp, apply_columns
from statehouse.backends.errors import BatchInFlight, KeyNotOwned, RescaleInProgress
from statehouse.backends.heap import HeapStore
from statehouse.backends.ops import BatchOps
from statehouse.backends.reserved import NON_KEYED_TABLES
from statehouse.backends.rocksdb.partition import RocksDBPartition
from statehouse.backends.rocksdb.snapshot import IncrementalSnapshotStrategy
from statehouse.backends.staging import AttemptRef, Winner
from statehouse.backends.timer_columns import TimerColumns
from statehouse.backends.timers import count_timers
from statehouse.protocol.keygroups import KeyGroupRange, assign_to_key_group
from statehouse.snapshots.full_format import FetchedKeyGroups
from statehouse.snapshots.handles import IncrementalHandle, KeyGroupsHandle
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.stored.descriptors import StateDescriptor
from tests.support.doors import DoorTransaction
from tests.support.job_contents import dump, global_checkpoint, operator_dump, owned_keys, populate

P = 128
MOVING = KeyGroupRange(64, 127)  # what replica 0 of 1 gives away going 1 -> 2
TARGET = 2  # the topology version the move goes to


def keys_in(key_groups: KeyGroupRange, n: int, key_type: str = "string") -> list:
    """``n`` keys whose key groups are in ``key_groups``."""
    found: list = []
    i = 0
    while len(found) < n:
        key = f"k{i}" if key_type == "string" else i
        if assign_to_key_group(key, key_type, P) in key_groups:
            found.append(key)
        i += 1
    return found


STAYING_KEY, MOVING_KEY = keys_in(KeyGroupRange(0, 63), 1)[0], keys_in(MOVING, 1)[0]


@pytest.fixture
def frozen_job(make_catalog):
    """A job on one replica holding a key that stays and one that moves, then frozen for the move."""
    job, _ = make_catalog().create("orders", P)
    job.register_state(StateDescriptor("v", "value"))
    job.register_state(StateDescriptor("s", "reducing", function="sum"))
    with job.transaction() as tx:
        for key in (STAYING_KEY, MOVING_KEY):
            tx.value("v").update(key, f"before-{key}")
            tx.reducing("s").add(key, 1)
            tx.timers.register("event", key, 100)
        tx.raw_keyed.replace(MOVING.start, b"raw")
        tx.operator.list_update("src", 0, "offsets", [1])
    job.freeze([MOVING], TARGET)
    return job


def _columns(tx, state: str, op: str, keys: list, values: list | None = None) -> None:
    columns = {"key": pa.array(keys, pa.string())}
    if values is not None:
        columns["value"] = pa.array(values)
    apply_columns(tx, ColumnOp.parse(state, op, pa.table(columns)))


def _timer_columns(tx, keys: list) -> None:
    columns = pa.table({"key": pa.array(keys, pa.string()), "timestamp": pa.array([5] * len(keys), pa.int64())})
    TimerColumns.parse("register", "event", "string", columns).apply(tx)


# One write of ``key`` through each door's engine entry (what the routes call).
WRITES = {
    "one_key": lambda tx, key: tx.value("v").update(key, "new"),
    "one_key_add": lambda tx, key: tx.reducing("s").add(key, 2),
    "one_key_clear": lambda tx, key: tx.value("v").clear(key),
    "batch": lambda tx, key: DoorTransaction(tx, "batch").value("v").update(key, "new"),
    "batch_add": lambda tx, key: DoorTransaction(tx, "batch").reducing("s").add(key, 2),
    "columnar": lambda tx, key: _columns(tx, "v", "put", [key], ["new"]),
    "columnar_add": lambda tx, key: _columns(tx, "s", "add", [key], [2]),
    "columnar_clear": lambda tx, key: _columns(tx, "v", "clear", [key]),
    "timer": lambda tx, key: tx.timers.register("event", key, 7),
    "timer_delete": lambda tx, key: tx.timers.delete("event", key, 100),
    "timer_columns": lambda tx, key: _timer_columns(tx, [key]),
    "raw": lambda tx, key: tx.raw_keyed.replace(assign_to_key_group(key, "string", P), b"new"),
}


def _reads(job) -> dict:
    with job.transaction() as tx:
        return {key: (tx.value("v").get(key), tx.reducing("s").get(key)) for key in (STAYING_KEY, MOVING_KEY)} | {
            "raw": tx.raw_keyed.get(MOVING.start),
            "timers": count_timers(job, "event"),
        }


@pytest.mark.parametrize("door", list(WRITES))
def test_freeze_refuses_writes_in_frozen_key_groups_and_serves_reads(frozen_job, door):
    job = frozen_job
    before = _reads(job)
    with pytest.raises(RescaleInProgress) as refused, job.transaction() as tx:
        WRITES[door](tx, MOVING_KEY)
    assert refused.value.version == TARGET and refused.value.extra["topology_version"] == TARGET
    assert _reads(job) == before  # nothing of the refused request was applied; reads answer
    with job.transaction() as tx:  # the key groups that stay take the same write
        WRITES[door](tx, STAYING_KEY)
    job.unfreeze()
    with job.transaction() as tx:
        WRITES[door](tx, MOVING_KEY)


@pytest.mark.parametrize("door", ["batch", "columnar", "timer_columns"])
def test_staged_writes_into_frozen_key_groups_are_refused(frozen_job, door):
    job = frozen_job
    job.fence(1)
    ops = {
        "batch": BatchOps([{"op": "put", "state": "v", "key": MOVING_KEY, "value": "staged"}]),
        "columnar": ColumnOp.parse("v", "put", pa.table({"key": [MOVING_KEY], "value": ["staged"]})),
        "timer_columns": TimerColumns.parse(
            "register", "event", "string", pa.table({"key": [MOVING_KEY], "timestamp": pa.array([5], pa.int64())})
        ),
    }
    with pytest.raises(RescaleInProgress):
        perform(job, ops[door], epoch=1, attempt=AttemptRef(0, "t0", 0))
    staying = BatchOps([{"op": "put", "state": "v", "key": STAYING_KEY, "value": "staged"}])
    perform(job, staying, epoch=1, attempt=AttemptRef(1, "t1", 0))
    winners = [Winner(1, "t1", 1)]
    prepare(job, 1, winners)
    commit(job, 1, winners)  # the epoch commits; what it staged is outside the frozen key groups
    with job.transaction() as tx:
        assert tx.value("v").get(STAYING_KEY) == "staged"
        assert tx.value("v").get(MOVING_KEY) == f"before-{MOVING_KEY}"


def test_timer_firing_in_frozen_key_groups_is_a_write(frozen_job):
    job = frozen_job
    with pytest.raises(RescaleInProgress):
        advance(job, "event", 1_000)
    assert advance(job, "event", 1_000, key_groups=KeyGroupRange(0, 63)).time == 1_000


def test_operator_state_is_frozen_while_the_job_is(frozen_job):
    job = frozen_job
    for write in (
        lambda tx: tx.operator.list_update("src", 0, "offsets", [2]),
        lambda tx: tx.operator.list_add("src", 0, "offsets", [2]),
        lambda tx: tx.operator.broadcast_put("rules", "cfg", "limit", 1),
    ):
        with pytest.raises(RescaleInProgress, match="operator state"), job.transaction() as tx:
            write(tx)
    with job.transaction() as tx:
        assert tx.operator.list_get("src", 0, "offsets") == [1]
    # A replica that gives nothing away (its range grows) still freezes its operator state.
    job.freeze([], TARGET)
    with pytest.raises(RescaleInProgress), job.transaction() as tx:
        tx.operator.list_update("src", 0, "offsets", [2])
    with job.transaction() as tx:
        tx.value("v").update(MOVING_KEY, "writable again")
    job.fence(3)  # metadata is no state a move carries: epochs go on
    assert job.register_state(StateDescriptor("later", "map"))  # a new state: nothing of it moves
    assert not job.register_state(StateDescriptor("v", "value"))  # the same again
    # changing or dropping one changes the key groups that move (the checkpoint keeps the old one)
    with pytest.raises(RescaleInProgress, match="changing state 'later'"):
        job.register_state(StateDescriptor("later", "map", function="sum"))
    with pytest.raises(RescaleInProgress, match="dropping state 'later'"):
        job.drop_state("later")
    job.unfreeze()
    job.drop_state("later")


def test_freeze_refused_while_an_open_epoch_staged_writes_there(make_catalog):
    job, _ = make_catalog().create("orders", P)
    job.register_state(StateDescriptor("v", "value"))
    job.fence(1)
    staged = BatchOps([{"op": "put", "state": "v", "key": MOVING_KEY, "value": 1}])
    perform(job, staged, epoch=1, attempt=AttemptRef(0, "a", 0))
    assert job.staged_epochs_in([MOVING]) == [1]
    assert job.staged_epochs_in([KeyGroupRange(0, 63)]) == []
    with pytest.raises(BatchInFlight) as refused:
        job.freeze([MOVING], TARGET)
    assert refused.value.extra == {"job": "orders", "epochs": [1]}
    with job.transaction() as tx:  # nothing was frozen
        tx.value("v").update(MOVING_KEY, 2)
        tx.operator.list_update("src", 0, "offsets", [1])
    job.freeze([KeyGroupRange(0, 63)], TARGET)  # what it staged is not there: frozen
    winners = [Winner(0, "a", 1)]
    prepare(job, 1, winners)
    commit(job, 1, winners)
    job.unfreeze()
    assert job.staged_epochs_in([MOVING]) == []  # committed: nothing open
    job.freeze([MOVING], TARGET)


def test_switch_layout_swaps_the_owned_range(make_catalog):
    catalog = make_catalog()
    job, _ = catalog.create("orders", P)
    job.register_state(StateDescriptor("v", "value"))
    with job.transaction() as tx:
        tx.value("v").update(MOVING_KEY, "moved")
    job.freeze([MOVING], TARGET)
    with job.transaction() as tx:  # a request holding the old keyspace finishes with it
        state = tx.value("v")
        catalog.switch_layout(2, 0, TARGET)  # (from another thread it would wait for the job's lock)
        assert state.get(MOVING_KEY) == "moved"
    assert job.key_group_range == KeyGroupRange(0, 63) and job.layout_version == TARGET
    with pytest.raises(KeyNotOwned) as refused, job.transaction() as tx:
        tx.value("v").get(MOVING_KEY)
    assert (refused.value.owner, refused.value.version) == (1, TARGET)
    with job.transaction() as tx:  # unfrozen: the key groups it keeps take writes
        tx.value("v").update(STAYING_KEY, "new layout")
        tx.operator.list_update("src", 0, "offsets", [1])
    # a job opened after the switch gets the new layout too
    job2, _ = catalog.create("later", P)
    assert job2.key_group_range == KeyGroupRange(0, 63) and job2.layout_version == TARGET


def _populate_columnar(job, keys: list) -> None:
    with job.transaction() as tx:
        _columns(tx, "v", "put", keys, list(range(len(keys))))


def test_drop_key_groups_deletes_every_keyed_table_and_nothing_else(make_catalog):
    catalog = make_catalog()
    job, _ = catalog.create("orders", P)
    job.register_state(StateDescriptor("v", "value"))
    job.register_state(StateDescriptor("m", "map"))
    keys = [f"k{i}" for i in range(2_000)]
    _populate_columnar(job, keys)
    with job.transaction() as tx:
        for key in keys[:200]:
            tx.map("m").put_all(key, {"a": 1, "b": 2})
            tx.timers.register("event", key, 5)
        for kg in (0, 63, 64, 127):
            tx.raw_keyed.replace(kg, b"raw")
        tx.operator.list_update("src", 0, "offsets", [1])
    catalog.switch_layout(2, 0, TARGET)
    with pytest.raises(ValueError, match="overlap"):
        job.drop_key_groups([KeyGroupRange(60, 70)])  # never what it owns
    job.drop_key_groups([MOVING])
    for table in set(job.partition.tables()) - NON_KEYED_TABLES:
        for kg in MOVING:
            assert list(job.partition.scan(table, kg)) == [], table
    with job.transaction() as tx:
        staying = [k for k in keys if assign_to_key_group(k, "string", P) < 64]
        assert [tx.value("v").get(k) for k in staying] == [keys.index(k) for k in staying]
        assert tx.raw_keyed.get(63) == b"raw" and tx.operator.list_get("src", 0, "offsets") == [1]
        assert sum(count_timers(job, "event").values()) == len([k for k in keys[:200] if k in staying])
    job.drop_key_groups([MOVING])  # again: nothing there, nothing happens


@pytest.mark.slow  # 5-13 s: filling a million keys
def test_drop_key_groups_of_a_million_keys_reads_nothing(make_catalog):
    catalog = make_catalog()
    job, _ = catalog.create("orders", P)
    job.register_state(StateDescriptor("v", "value"))
    for start in range(0, 1_000_000, 100_000):
        _populate_columnar(job, [f"key-{i}" for i in range(start, start + 100_000)])
    catalog.switch_layout(2, 0, TARGET)
    tracemalloc.start()
    try:
        job.drop_key_groups([MOVING])
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak  # no entry read or listed: bounded whatever the key count
    assert all(not list(job.partition.scan("v", kg)) for kg in (64, 100, 127))
    assert next(iter(job.partition.scan("v", 0)), None) is not None
    if catalog.store.name == "rocksdb":  # compacted away: no table file (what checkpoints upload) keeps them
        job.partition._acquire()
        try:
            files = [f for f in job.partition._db.live_files() if f["num_entries"] > 100]
        finally:
            job.partition._release()
        assert files and all(f["end_key"][:1] < bytes([64]) for f in files), files


# -- a whole move, in process: the coordinator's steps on N old and M new replica catalogs ---------


def _fill(job, n: int) -> None:
    """Every kind of state for the keys the replica owns, timers, raw keyed streams, operator state."""
    populate(job, n, tag=f"r{job.replica_index}")
    with job.transaction() as tx:
        for key in owned_keys(job, [f"k{i}" for i in range(n)]):
            tx.timers.register("event", key, 1_000 + len(key))
        for kg in list(job.key_group_range)[::5]:
            tx.raw_keyed.replace(kg, f"raw-{kg}".encode())


def _ranges(old: KeyGroupRange, new: KeyGroupRange) -> list[KeyGroupRange]:
    """``new`` minus ``old``: at most two contiguous ranges."""
    if not len(old):
        return [new] if len(new) else []
    below, above = (
        KeyGroupRange(new.start, min(new.end, old.start - 1)),
        KeyGroupRange(max(new.start, old.end + 1), new.end),
    )
    return [r for r in (below, above) if len(r)]


class Move:
    """The coordinator's steps of a live rescale of job ``orders`` from ``old`` to ``new`` replicas,
    on catalogs (one per replica index, old and new), against one checkpoint storage."""

    def __init__(self, catalogs, storage, old: int, new: int, make_manager) -> None:
        self.catalogs, self.storage, self.old, self.new = catalogs, storage, old, new
        self.make_manager = make_manager
        self.version = 2
        self.loads: dict[int, MergeRestore] = {}

    def owned(self, count: int, index: int) -> KeyGroupRange:
        return KeyGroupRange.for_operator(P, count, index) if index < count else KeyGroupRange.empty()

    def moving_out(self, i: int) -> list[KeyGroupRange]:
        return _ranges(self.owned(self.new, i), self.owned(self.old, i))

    def moving_in(self, i: int) -> list[KeyGroupRange]:
        return _ranges(self.owned(self.old, i), self.owned(self.new, i))

    def prepare_and_checkpoint(self) -> None:
        for i in range(self.old):
            self.catalogs[i].get("orders").freeze(self.moving_out(i), self.version)
        for i in range(self.old, self.new):
            self.catalogs[i].serving = False  # a joining replica holds no served job
        managers = [self.make_manager(self.catalogs[i], self.storage) for i in range(self.old)]
        global_checkpoint(managers, "orders", 1)
        _directory, self.parts = managers[0].snapshots.parts("orders", 1)

    def load(self, i: int) -> MergeRestore:
        manager = self.make_manager(self.catalogs[i], self.storage)
        load = manager.load_key_groups("orders", 1, self.moving_in(i), self.new, i)
        self.loads[i] = load
        return load

    def commit(self) -> None:
        for i, catalog in enumerate(self.catalogs):
            job = catalog.get("orders", serving=False)
            job.apply_staged_operator_state()
            catalog.switch_layout(self.new, i, self.version)
            job.drop_key_groups(self.moving_out(i))


def _layout(make_catalog, tmp_path, old: int, new: int, incremental: bool = False) -> list:
    """Old replicas' catalogs (index < old), then the new ones, started with the new count."""
    return [
        make_catalog(i, old if i < old else new, tmp_path / f"replica-{i}", incremental=incremental)
        for i in range(max(old, new))
    ]


def _oracle(catalogs) -> dict:
    """What a plain reader sees of every key, asked of its owner (one transaction per replica)."""
    seen = {}
    for catalog in catalogs:
        job = catalog.get("orders")
        keys = owned_keys(job, [f"k{i}" for i in range(400)])
        with job.transaction() as tx:
            for key in keys:
                seen[key] = (tx.value("v").get(key), tx.map("m").get_all(key), tx.value("v").get(key, f"ns-{key}"))
    return seen


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2)])
def test_live_move_equals_an_offline_restore_and_every_key_is_on_its_owner(
    make_catalog, make_manager, tmp_path, old, new
):
    catalogs = _layout(make_catalog, tmp_path, old, new)
    expected: dict = {}
    for catalog in catalogs[:old]:
        job, _ = catalog.create("orders", P)
        _fill(job, 400)
        expected.update(dump(job))
    reads = _oracle(catalogs[:old])
    move = Move(catalogs, open_storage(str(tmp_path / "checkpoints")), old, new, make_manager)
    move.prepare_and_checkpoint()
    for i in range(new):
        load = move.load(i)
        assert load.key_groups_fetched == {kg for r in move.moving_in(i) for kg in r}
    # loaded, not yet served: the old layout answers as before
    assert _oracle(catalogs[:old]) == reads
    move.commit()

    serving = catalogs[:new]
    seen: dict = {}
    for i, catalog in enumerate(serving):
        job = catalog.get("orders")
        assert job.key_group_range == KeyGroupRange.for_operator(P, new, i)
        stored = dump_all(job)
        for entry in stored:
            key_group = entry[1]
            assert key_group in job.key_group_range, f"{entry} stored on replica {i}, which does not own it"
            assert entry not in seen
        seen.update(stored)
        # what an offline restore of the checkpoint gives this replica, operator state included
        offline = JobCatalog(HeapStore(), replica_index=i, replica_count=new)
        make_manager(offline, move.storage).restore("orders", 1)
        assert stored == dump(offline.get("orders"))
        assert operator_dump(job) == operator_dump(offline.get("orders"))
    assert seen == expected  # every key exactly once, on its owner, as it was
    assert _oracle(serving) == reads
    for i, catalog in enumerate(catalogs[new:], new):  # removed replicas hold nothing, own nothing
        job = catalog.get("orders", serving=False)
        assert dump_all(job) == {} and not len(job.key_group_range)
        with pytest.raises(KeyNotOwned), job.transaction() as tx:
            tx.value("v").get("k1")
        # and so after a restart (the catalog opened with the recorded count and its index past it)
        if catalog.store.name == "rocksdb":
            catalog.close()
            again = make_catalog(i, new, tmp_path / f"replica-{i}")
            assert not again.serving and not len(again.get("orders", serving=False).key_group_range)


def dump_all(job) -> dict:
    """Every keyed entry the job's partition stores, whatever it owns."""
    out = {}
    for table in job.partition.tables():
        if table in NON_KEYED_TABLES:
            continue
        for kg in range(job.max_parallelism):
            for primary, secondary, value in job.partition.scan(table, kg):
                out[(table, kg, primary, secondary)] = value
    return out


def test_an_interrupted_load_run_again_loads_the_same(make_catalog, make_manager, tmp_path, monkeypatch):
    catalogs = _layout(make_catalog, tmp_path, 2, 3)
    for catalog in catalogs[:2]:
        _fill(catalog.create("orders", P)[0], 400)
    move = Move(catalogs, open_storage(str(tmp_path / "checkpoints")), 2, 3, make_manager)
    move.prepare_and_checkpoint()
    clean = {i: dump_all(_loaded(move, i, catalogs)) for i in (1, 2)}  # loads that ran through

    for i in (1, 2):
        _loaded(move, i, catalogs).drop_key_groups(move.moving_in(i))
        small_loads(monkeypatch, 10)
        real, sections = FetchedKeyGroups.section_tuples, itertools.count()

        def failing(self, real=real, sections=sections):
            for section in real(self):
                if next(sections) == 4:
                    raise OSError("the replica died mid-load")
                yield section

        monkeypatch.setattr(FetchedKeyGroups, "section_tuples", failing)
        with pytest.raises(OSError, match="mid-load"):
            move.load(i)
        partial = _within(dump_all(catalogs[i].get("orders", serving=False)), move.moving_in(i))
        assert 0 < len(partial) < len(_within(clean[i], move.moving_in(i)))  # it died with part of it loaded
        monkeypatch.undo()
        move.load(i)  # run again: clears what the first left, loads it all
        assert dump_all(catalogs[i].get("orders", serving=False)) == clean[i]


@pytest.mark.parametrize("backend", ["rocksdb"], indirect=True)  # the heap backend writes what it loads
@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "full"])
def test_a_load_into_rocksdb_ingests_table_files_and_a_cut_one_runs_again(
    make_catalog, make_manager, tmp_path, monkeypatch, incremental
):
    catalogs = _layout(make_catalog, tmp_path, 2, 3, incremental=incremental)
    for catalog in catalogs[:2]:
        _fill(catalog.create("orders", P)[0], 400)
    move = Move(catalogs, open_storage(str(tmp_path / "checkpoints")), 2, 3, make_manager)
    move.prepare_and_checkpoint()
    handle = IncrementalHandle if incremental else KeyGroupsHandle
    assert {type(part.metadata.keyed) for part in move.parts} == {handle}
    ingested: list[str] = []
    real = RocksDBPartition.ingest_table_file

    def counted(self, table, path, key_groups, guard):
        ingested.append(table)
        if len(ingested) == 3 and cut:
            raise OSError("the replica died mid-load")
        return real(self, table, path, key_groups, guard)

    monkeypatch.setattr(RocksDBPartition, "ingest_table_file", counted)
    real_write = RocksDBPartition.write

    def write(self, ops):
        assert all(op.table in NON_KEYED_TABLES for op in ops), "a load wrote keyed entries"
        return real_write(self, ops)

    monkeypatch.setattr(RocksDBPartition, "write", write)
    cut = True
    with pytest.raises(OSError, match="mid-load"):
        move.load(2)
    partial = _within(dump_all(catalogs[2].get("orders", serving=False)), move.moving_in(2))
    cut = False
    move.load(2)  # run again: clears what the first left, loads it all
    loaded = _within(dump_all(catalogs[2].get("orders", serving=False)), move.moving_in(2))
    assert 0 < len(partial) < len(loaded) and len(ingested) > 4
    # What the ingested files hold is what the old owners stored in those key groups.
    old = {}
    for catalog in catalogs[:2]:
        old.update(_within(dump_all(catalog.get("orders")), move.moving_in(2)))
    assert loaded == old


def small_loads(monkeypatch, entries: int) -> None:
    """Loads in batches (or, into RocksDB, table files) of ``entries``."""
    monkeypatch.setattr(partition_module, "LOAD_BATCH", entries)
    monkeypatch.setattr(rocksdb_partition, "_LOAD_RUN_ENTRIES", entries)


def _loaded(move: Move, i: int, catalogs) -> object:
    if i not in move.loads:
        move.load(i)
    return catalogs[i].get("orders", serving=False)


def _within(entries: dict, ranges: list[KeyGroupRange]) -> dict:
    return {e: v for e, v in entries.items() if any(e[1] in r for r in ranges)}


def _share_move(
    make_catalog, make_manager, tmp_path, storage, incremental: bool, move_file_bytes: int | None = None
) -> tuple[Move, int]:
    """Two replicas of 20,000 keys, frozen and checkpointed for a move to three; and the bytes of the
    checkpoint's full keyed streams (0 for incremental parts). ``move_file_bytes``: the old replicas
    compact what moves into files of that size first (STATEHOUSE_RESCALE_COMPACT_MOVING)."""
    catalogs = _layout(make_catalog, tmp_path, 2, 3, incremental)
    if move_file_bytes is not None:
        for catalog in catalogs[:2]:
            catalog.store.incremental = IncrementalSnapshotStrategy(move_file_bytes)
    for catalog in catalogs[:2]:
        job, _ = catalog.create("orders", P)
        job.register_state(StateDescriptor("v", "value"))
        _populate_columnar(job, owned_keys(job, [f"key-{i}" for i in range(20_000)]))
    move = Move(catalogs, storage, 2, 3, lambda c, s: make_manager(c, s, compression="none"))
    move.prepare_and_checkpoint()
    keyed = sum(
        len(storage.read(f"{p.directory}/{p.metadata.keyed.stream.path}")) for p in move.parts if not incremental
    )
    return move, keyed


def _reads_its_share(move: Move, keyed: int) -> MergeRestore:
    load = move.load(2)
    wanted = move.moving_in(2)
    assert wanted == [KeyGroupRange(86, 127)]
    assert load.key_groups_fetched == set(wanted[0])  # not one key group outside W_2 \ O_2
    assert load.entries == len(dump_all(move.catalogs[2].get("orders", serving=False)))
    if keyed:  # ranged reads: its share of the full parts (42 of 128 key groups), not all of them
        share = len(wanted[0]) / P
        assert 0.8 * share * keyed < load.bytes_read < 1.25 * share * keyed + (64 << 10), (load.bytes_read, keyed)
    return load


# Incremental checkpoints are RocksDB's alone (the heap backend's are full).
@pytest.mark.parametrize(
    ("backend", "incremental"), [("heap", False), ("rocksdb", False), ("rocksdb", True)], indirect=["backend"]
)
def test_a_new_replica_reads_its_share(make_catalog, make_manager, tmp_path, incremental):
    storage = open_storage(str(tmp_path / "checkpoints"))
    _reads_its_share(*_share_move(make_catalog, make_manager, tmp_path, storage, incremental))


@pytest.mark.s3
def test_a_new_replica_reads_its_share_from_s3(make_catalog, make_manager, tmp_path, s3_server, s3_location):
    storage = open_storage(s3_location, s3_endpoint_url=s3_server.endpoint)
    move, keyed = _share_move(make_catalog, make_manager, tmp_path, storage, incremental=False)
    _reads_its_share(move, keyed)
    move.load(1)
    move.commit()
    assert sum(len(dump(c.get("orders"))) for c in move.catalogs) == 20_000  # every key, once


def test_a_load_into_a_live_job_lets_its_writes_go_on(make_catalog, make_manager, tmp_path, monkeypatch):
    catalogs = _layout(make_catalog, tmp_path, 2, 3)
    for catalog in catalogs[:2]:
        _fill(catalog.create("orders", P)[0], 400)
    move = Move(catalogs, open_storage(str(tmp_path / "checkpoints")), 2, 3, make_manager)
    move.prepare_and_checkpoint()
    job = catalogs[1].get("orders")  # owns 64-127; loads 43-63; keeps 64-85 through the move
    kept = keys_in(KeyGroupRange(64, 85), 20)
    small_loads(monkeypatch, 20)  # many batches or files: the writer gets the lock between them
    loading, wrote, written = threading.Event(), threading.Event(), []

    def writer() -> None:
        loading.wait()
        n = 0
        while loading.is_set():
            with job.transaction() as tx:
                tx.value("v").update(kept[n % len(kept)], n)
            written.append(n)
            wrote.set()
            n += 1

    real, sections = FetchedKeyGroups.section_tuples, itertools.count()

    def announced(self):
        loading.set()
        for section in real(self):
            if next(sections) == 1:  # the first section is in: a write goes between it and the next
                wrote.clear()
                assert wrote.wait(60), "the writer never got the job between two sections"
            yield section

    monkeypatch.setattr(FetchedKeyGroups, "section_tuples", announced)
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        move.load(1)
    finally:
        loading.clear()
        thread.join()
    monkeypatch.undo()
    with job.transaction() as tx:
        last = {kept[n % len(kept)]: n for n in written}
        assert {k: tx.value("v").get(k) for k in last} == last
    move.load(0)
    move.load(2)
    move.commit()
    assert sum(len(dump(c.get("orders"))) for c in catalogs) == sum(len(dump_all(c.get("orders"))) for c in catalogs)


def test_a_load_holds_one_chunk_of_key_groups_at_a_time(make_catalog, make_manager, tmp_path, monkeypatch):
    storage = open_storage(str(tmp_path / "checkpoints"))
    move, keyed = _share_move(make_catalog, make_manager, tmp_path, storage, incremental=False)
    section = max(s.length for p in move.parts for s in p.metadata.keyed.offsets.sections)
    monkeypatch.setattr(restore, "LOAD_FETCH_BYTES", 4 * section)
    reads: list[int] = []
    real = type(storage).read_existing

    def counted(self, handle, offset=0, length=None):
        data = real(self, handle, offset, length)
        reads.append(len(data))
        return data

    monkeypatch.setattr(type(storage), "read_existing", counted)
    load = _reads_its_share(move, keyed)  # the same share, the same key groups, every entry
    assert len(reads) >= len(move.moving_in(2)[0]) // 4  # many ranged reads ...
    assert max(reads) <= 4 * section  # ... none holding more than the budget
    move.load(1)
    move.commit()
    assert sum(len(dump(c.get("orders"))) for c in move.catalogs) == 20_000
    assert load.entries == len(dump(move.catalogs[2].get("orders")))


def _round(job, key_groups: KeyGroupRange, tag: str, n: int = 1_200, deletes: bool = False) -> None:
    """Write (or overwrite, and delete some of) every kind of keyed state for the keys of
    ``key_groups`` this replica owns, then flush: each round is new table files spanning only
    those key groups."""
    keys = [
        k for k in owned_keys(job, [f"k{i}" for i in range(n)]) if assign_to_key_group(k, "string", P) in key_groups
    ]
    with job.transaction() as tx:
        for i, k in enumerate(keys):
            if deletes and i % 3 == 0:  # a tombstone in a newer file over a value in an older one
                tx.value("v").clear(k)
                tx.map("m").remove(k, "a")
                tx.timers.delete("event", k, 1_000 + len(k))
                continue
            tx.value("v").update(k, {"n": k, "tag": tag})
            tx.value("v").update(k, f"ns-{k}-{tag}", namespace="w1")
            tx.map("m").put_all(k, {"a": tag, "b": [k, tag]})
            tx.timers.register("event", k, 1_000 + len(k))
        for kg in list(key_groups)[:: 3 if deletes else 2]:
            tx.raw_keyed.replace(kg, f"raw-{kg}-{tag}".encode())
    job.partition.flush()


@pytest.mark.parametrize("backend", ["rocksdb"], indirect=True)
def test_an_incremental_load_downloads_only_the_files_of_its_key_groups(
    make_catalog, make_manager, tmp_path, monkeypatch
):
    """2 -> 3 from incremental checkpoints whose table files each span part of a replica's key
    groups: a load downloads the files overlapping what it takes (and the private ones), not the
    others, rebuilds the database from them, and copies out exactly what the old replicas held."""
    catalogs = _layout(make_catalog, tmp_path, 2, 3, incremental=True)
    expected: dict = {}
    for i, catalog in enumerate(catalogs[:2]):
        job, _ = catalog.create("orders", P)
        job.register_state(StateDescriptor("v", "value"))
        job.register_state(StateDescriptor("m", "map"))
        owned = job.key_group_range
        stays = KeyGroupRange.for_operator(P, 3, i)  # what replica i keeps under the new layout
        # replica 0 keeps 0-42 and gives 43-63 to replica 1; replica 1 keeps 64-85, gives 86-127 to 2
        keep, give = KeyGroupRange(owned.start, stays.end), KeyGroupRange(stays.end + 1, owned.end)
        _round(job, keep, "kept")
        _round(job, give, "first")
        _round(job, give, "second", deletes=True)  # newer versions and tombstones over the first's
        expected.update(dump_all(job))
    storage = open_storage(str(tmp_path / "checkpoints"))
    move = Move(catalogs, storage, 2, 3, lambda c, s: make_manager(c, s, compression="none"))
    move.prepare_and_checkpoint()

    downloaded: list[str] = []
    real = type(storage).download_verified

    def counted(self, handle, target):
        downloaded.append(handle.path.rsplit("/", 1)[-1])
        return real(self, handle, target)

    monkeypatch.setattr(type(storage), "download_verified", counted)
    for i in (1, 2):
        (part,) = [p for p in move.parts if len(p.metadata.key_group_range.intersection(move.moving_in(i)[0]))]
        handle = part.metadata.keyed
        assert handle.spans, "the checkpoint recorded its table files' key groups"
        needed = handle.files_for(move.moving_in(i)[0])
        skipped = set(handle.shared) - set(needed)
        assert skipped, "some of the part's table files hold only key groups the load does not take"
        downloaded.clear()
        load = move.load(i)
        fetched = {
            name for name, h in {**handle.shared, **handle.private}.items() if h.path.endswith(tuple(downloaded))
        }
        assert fetched == set(needed)  # every file it needs, none it does not
        operator = sum(p.metadata.operator.size for p in move.parts)
        assert load.bytes_read == sum(h.size for h in needed.values()) + operator  # bytes from storage
        assert load.bytes_read < sum(h.size for h in {**handle.shared, **handle.private}.values())
    move.load(0)
    move.commit()
    seen: dict = {}
    for i, catalog in enumerate(catalogs):
        stored = dump_all(catalog.get("orders"))
        assert all(entry[1] in KeyGroupRange.for_operator(P, 3, i) for entry in stored)
        seen.update(stored)
    assert seen == expected  # every key, value, namespace, map entry, timer and raw stream, once


def test_an_incremental_handle_without_spans_reads_every_file():
    """Handles written before spans were recorded are read whole; with spans, a file is read iff
    its key groups overlap the ones wanted."""
    data = {
        "type": "incremental",
        "backend_uid": "u",
        "key_group_range": [0, 63],
        "checkpoint_id": 3,
        "shared": {n: {"path": f"../shared/x-{n}", "size": 1, "sha256": "h"} for n in ("000007.sst", "000009.sst")},
        "private": {"MANIFEST-000005": {"path": "db/MANIFEST-000005", "size": 1, "sha256": "h"}},
        "tables": {"v": False},
    }
    old = IncrementalHandle.from_dict(data)
    assert set(old.files_for(KeyGroupRange(40, 41))) == {"000007.sst", "000009.sst", "MANIFEST-000005"}
    new = IncrementalHandle.from_dict({**data, "spans": {"000007.sst": ["v", 0, 39], "000009.sst": ["v", 40, 63]}})
    assert IncrementalHandle.from_dict(new.to_dict()) == new
    assert set(new.files_for(KeyGroupRange(40, 41))) == {"000009.sst", "MANIFEST-000005"}
    assert set(new.files_for(KeyGroupRange(39, 40))) == {"000007.sst", "000009.sst", "MANIFEST-000005"}
    assert set(new.files_for(KeyGroupRange(0, 0))) == {"000007.sst", "MANIFEST-000005"}


@pytest.mark.parametrize("backend", ["rocksdb"], indirect=True)
@pytest.mark.parametrize("compact", [True, False])
def test_a_moves_checkpoint_compacts_what_moves_so_a_load_reads_about_its_share(
    make_catalog, make_manager, tmp_path, compact
):
    """Memtable flushes (level 0) span every key group, so a load would download them whole
    (``compact=False``: every file of the part); the move's checkpoint first compacts the frozen
    key groups into small files, and the load downloads about its share."""
    storage = open_storage(str(tmp_path / "checkpoints"))
    files = 16 << 10 if compact else None  # of ~200 KB
    move, _ = _share_move(make_catalog, make_manager, tmp_path, storage, incremental=True, move_file_bytes=files)
    (part,) = [p for p in move.parts if p.metadata.replica_index == 1]  # old replica 1 holds 64-127
    handle = part.metadata.keyed
    keyed = sum(h.size for h in handle.shared.values())
    load = _reads_its_share(move, 0)  # 86-127: every entry, no other key group
    operator = sum(p.metadata.operator.size for p in move.parts)
    taken = load.bytes_read - operator - sum(h.size for h in handle.private.values())
    share = len(move.moving_in(2)[0]) / len(part.metadata.key_group_range)  # 42 of 64 key groups
    if compact:  # its share, give or take the key groups' sizes, and at most a file at each edge
        edges = 2 * max(h.size for h in handle.shared.values())
        assert taken < 0.9 * keyed and taken <= 1.1 * share * keyed + edges, (taken, share * keyed, edges)
    else:
        assert taken == keyed  # every table file spans every key group it holds: all are read
    move.load(1)
    move.commit()
    assert sum(len(dump(c.get("orders"))) for c in move.catalogs) == 20_000  # every key, once
