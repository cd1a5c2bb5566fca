"""A pre-copy's change tracking and delta (backends/change_tracker.py, backends/checkpointing/precopy.py):
a copy of a job's key groups, brought up to date by the delta of what changed since through every
engine door, holds exactly what the job holds; a tracker that cannot follow the changes says so;
a damaged delta is not used."""

from __future__ import annotations

import pyarrow as pa
import pytest

from statehouse.backends.base.partition import RowChanges, WriteOp
from statehouse.backends.change_tracker import ChangeTracker
from statehouse.backends.checkpointing.precopy import (
    Delta,
    apply_delta,
    delta_path,
    read_delta,
    read_rounds,
    write_delta,
)
from statehouse.backends.columns import ColumnOp, apply_columns
from statehouse.backends.reserved import META_TABLE, NON_KEYED_TABLES
from statehouse.protocol.keygroups import KeyGroupRange, assign_to_key_group
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.stored.descriptors import StateDescriptor

P = 128
MOVING = KeyGroupRange(64, 127)
KEYS = [f"k{i}" for i in range(300)]
STATES = [
    StateDescriptor("v", "value"),
    StateDescriptor("m", "map"),
    StateDescriptor("l", "list"),
    StateDescriptor("s", "reducing", function="sum"),
]


def stored(job, ranges: list[KeyGroupRange]) -> dict:
    """Every keyed entry in ``ranges`` as stored bytes."""
    out = {}
    for table in job.partition.tables():
        if table in NON_KEYED_TABLES:
            continue
        for r in ranges:
            for kg in r:
                for primary, secondary, value in job.partition.scan(table, kg):
                    out[(table, kg, primary, secondary)] = value
    return out


def fill(job) -> None:
    for descriptor in STATES:
        job.register_state(descriptor)
    with job.transaction() as tx:
        for i, key in enumerate(KEYS):
            tx.value("v").update(key, i)
            tx.map("m").put_all(key, {"a": i, "b": -i})
            tx.list("l").add_all(key, [i, i + 1])
            tx.reducing("s").add(key, i)
            tx.timers.register("event", key, 100 + i)


def change(job) -> None:
    """Every kind of change, through the one-key, columnar and timer doors, over every key."""
    job.register_state(StateDescriptor("late", "value"))
    with job.transaction() as tx:
        for i, key in enumerate(KEYS):
            kind = i % 7
            if kind == 0:
                tx.value("v").update(key, 1000 + i)
            elif kind == 1:
                tx.value("v").clear(key)
            elif kind == 2:
                tx.map("m").put(key, "c", i)
                tx.map("m").remove(key, "a")
            elif kind == 3:
                tx.map("m").clear(key)
            elif kind == 4:
                tx.list("l").clear(key)
                tx.timers.delete("event", key, 100 + i)
            elif kind == 5:
                tx.reducing("s").add(key, 5)
                tx.value("late").update(key, i)
        table = pa.table({"key": pa.array(KEYS[::3], pa.string()), "value": pa.array(range(len(KEYS[::3])))})
        apply_columns(tx, ColumnOp.parse("v", "put", table))  # a columnar request's rows (RowChanges)
        tx.value("v").update("fresh", 1)


@pytest.mark.parametrize("restarted_tracker", [False, True])
def test_a_copy_brought_up_by_the_delta_holds_what_the_job_holds(make_catalog, tmp_path, restarted_tracker):
    source, _ = make_catalog(data_dir=tmp_path / "source").create("j", P)
    copy, _ = make_catalog(data_dir=tmp_path / "copy").create("j", P)
    fill(source)
    fill(copy)  # the copy: what a checkpoint taken after the tracker started holds
    source.track_changes([MOVING], "t1")
    if restarted_tracker:  # the same token again keeps the tracker (a prepare repeated)
        assert source.track_changes([MOVING], "t1") is source.tracker
    change(source)
    assert stored(copy, [MOVING]) != stored(source, [MOVING])

    round_, tables, changed = source.changed("t1")
    assert round_ == 0 and changed and all(kg in MOVING for kg, *_ in changed)
    assert source.changed("other token") is None
    delta = Delta.from_bytes(Delta("t1", [MOVING], tables, changed).to_bytes())
    outside = stored(copy, [KeyGroupRange(0, 63)])
    apply_delta(copy, delta, [MOVING])
    assert stored(copy, [MOVING]) == stored(source, [MOVING])
    assert stored(copy, [KeyGroupRange(0, 63)]) == outside  # nothing outside what it brings up


def test_catch_up_rounds_then_the_cut_bring_the_copy_up_to_date_in_order(make_catalog, tmp_path):
    """Round 0 (a catch-up, writes going on) takes the keys noted so far and begins round 1; what
    is written after it is noted again, also keys round 0 carried. Rounds applied in order, the cut's
    last, leave the copy equal to the job; a reader stops at a missing round, another tracker's
    round, and says whether it reached the cut."""
    source, _ = make_catalog(data_dir=tmp_path / "source").create("j", P)
    copy, _ = make_catalog(data_dir=tmp_path / "copy").create("j", P)
    storage = open_storage(str(tmp_path / "storage"))
    fill(source)
    fill(copy)
    source.track_changes([MOVING], "t1")
    change(source)
    round0 = source.changed("t1", take_round=True)
    assert round0 is not None and round0[0] == 0 and round0[2]
    assert source.tracker is not None and source.tracker.round == 1 and not source.tracker.touched
    with source.transaction() as tx:  # after the round: noted again, some keys round 0 carried too
        for i, key in enumerate(KEYS[:40]):
            tx.value("v").update(key, 5000 + i)
            tx.map("m").put(key, "late-entry", i)
    cut = source.changed("t1")
    assert cut is not None and cut[0] == 1 and 0 < len(cut[2]) < len(round0[2])
    path = lambda r: delta_path("set", 2, "j", 0, r)  # noqa: E731
    write_delta(storage, path(0), Delta("t1", [MOVING], round0[1], round0[2], 0, cut=False))
    assert read_rounds(storage, "set", 2, "j", 0, "t1", 0) == ([read_delta(storage, path(0))], False)
    write_delta(storage, path(1), Delta("t1", [MOVING], cut[1], cut[2], 1, cut=True))
    deltas, to_cut = read_rounds(storage, "set", 2, "j", 0, "t1", 0)
    assert [d.round for d in deltas] == [0, 1] and to_cut
    assert read_rounds(storage, "set", 2, "j", 0, "other", 0) == ([], False)
    assert read_rounds(storage, "set", 2, "j", 0, "t1", 1)[1]  # from round 1 on: the cut alone
    for delta in deltas:
        apply_delta(copy, delta, [MOVING])
    assert stored(copy, [MOVING]) == stored(source, [MOVING])


def test_a_dropped_state_or_too_many_keys_invalidates_the_tracker(make_catalog):
    job, _ = make_catalog().create("j", P)
    fill(job)
    job.track_changes([MOVING], "t1")
    job.drop_state("l")
    assert job.changed("t1") is None

    tracker = ChangeTracker("t2", [MOVING], max_keys=10)
    moving = [k for k in KEYS if assign_to_key_group(k, "string", P) in MOVING]
    kgs = [assign_to_key_group(k, "string", P) for k in moving]
    tracker.note({"v": RowChanges(kgs[:5], [k.encode() for k in moving[:5]], [b"x"] * 5)}, [])
    tracker.note({META_TABLE: {(kgs[0], b"meta"): b"x"}}, [WriteOp("put", "m", 3, b"outside", b"e", b"x")])
    assert tracker.valid and len(tracker.touched) == 5  # not the metadata, not key group 3
    tracker.note({"v": {(kg, k.encode()): None for kg, k in zip(kgs, moving, strict=False)}}, [])
    assert not tracker.valid and tracker.touched == set()


def test_a_damaged_or_missing_delta_is_not_used(tmp_path):
    storage = open_storage(str(tmp_path / "storage"))
    path = delta_path("set", 2, "j", 0)
    assert read_delta(storage, path) is None
    delta = Delta("t1", [MOVING], {"v": False}, [(64, "v", b"k", [(b"", b"1")])])
    write_delta(storage, path, delta)
    assert read_delta(storage, path) == delta
    data = delta.to_bytes()
    for damaged in (data[:-1], data[:10], b"x" + data[1:]):
        with storage.create_output(path) as out:
            out.write(damaged)
            out.close_and_get_handle()
        assert read_delta(storage, path) is None
