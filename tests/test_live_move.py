"""The engine's primitives of a live rescale (RESCALE.md "Engine API"), in process, both backends:
freezing the key groups that move (writes refused through every door, reads served), switching
a job's layout, dropping key groups, and merge-restoring moving-in key groups into live jobs."""

from __future__ import annotations

import tracemalloc

import pyarrow as pa
import pytest

from statehouse.backends.attempts import advance, commit, perform, prepare
from statehouse.backends.columns import ColumnOp, apply_columns
from statehouse.backends.descriptors import StateDescriptor
from statehouse.backends.errors import BatchInFlight, KeyNotOwned, RescaleInProgress
from statehouse.backends.ops import BatchOps
from statehouse.backends.reserved import NON_KEYED_TABLES
from statehouse.backends.staging import AttemptRef, Winner
from statehouse.backends.timer_columns import TimerColumns
from statehouse.backends.timers import count_timers
from statehouse.keygroups import KeyGroupRange, assign_to_key_group
from tests.doors import DoorTransaction

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
    job.register_state(StateDescriptor("later", "value"))


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


@pytest.mark.slow
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
