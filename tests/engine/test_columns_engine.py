"""The columnar core in process, on both backends: rows of one request behave as the same
operations one after the other (duplicate keys, TTL expiry and refresh, errors naming rows)."""

import pyarrow as pa
import pytest

from statehouse.backends.columns import ColumnOp, apply_columns
from statehouse.backends.errors import KeyNotOwned
from statehouse.protocol.errors import InvalidValue
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.ttl import TtlConfig

EXPIRED_VISIBLE = TtlConfig(100, visibility="return_expired_if_not_cleaned_up", cleanup_incremental_size=0)


def columns(job, state, op, **cols):
    with job.transaction() as tx:
        result = apply_columns(tx, ColumnOp.parse(state, op, pa.table(cols)))
    return None if result is None else result.to_pylist()


def one_by_one(job, fn, times):
    with job.transaction() as tx:
        return [fn(tx) for _ in range(times)]


@pytest.mark.parametrize("kind", ["value", "reducing"])
def test_an_expired_record_read_twice_in_one_request_is_returned_once(job, clock, kind):
    extra = {"function": "sum"} if kind == "reducing" else {}
    for name in ("a", "b"):
        job.register_state(StateDescriptor(name, kind, ttl=EXPIRED_VISIBLE, **extra))
    columns(job, "a", "put" if kind == "value" else "add", key=["k"], value=[5])
    columns(job, "b", "put" if kind == "value" else "add", key=["k"], value=[5])
    clock.advance(200)
    per_op = one_by_one(job, lambda tx: tx.state("b").get("k"), 2)
    assert per_op == [5, None]  # Flink: returned once, then cleared
    assert columns(job, "a", "get", key=["k", "k"]) == per_op


def test_an_expired_list_read_twice_in_one_request_is_returned_once(job, clock):
    for name in ("a", "b"):
        job.register_state(StateDescriptor(name, "list", ttl=EXPIRED_VISIBLE))
        columns(job, name, "add", key=["k", "k"], value=[1, 2])
    clock.advance(200)
    per_op = one_by_one(job, lambda tx: tx.list("b").get("k"), 2)
    assert per_op == [[1, 2], None]
    assert columns(job, "a", "get", key=["k", "k"]) == per_op


def test_refresh_on_read_then_write_in_order(job, clock):
    ttl = TtlConfig(100, update_type="on_read_and_write", cleanup_incremental_size=0)
    job.register_state(StateDescriptor("v", "value", ttl=ttl))
    columns(job, "v", "put", key=["k"], value=[1])
    clock.advance(90)
    assert columns(job, "v", "get", key=["k"]) == [1]  # refreshed at 1090
    clock.advance(90)
    assert columns(job, "v", "get", key=["k", "k"]) == [1, 1]  # alive: 1180 < 1090 + 100


def test_adds_fold_in_row_order_with_duplicates(job):
    job.register_state(StateDescriptor("mx", "reducing", function="max"))
    job.register_state(StateDescriptor("first", "reducing", function="first"))
    columns(job, "first", "add", key=["a", "b", "a"], value=["x", "y", "z"])
    columns(job, "mx", "add", key=["a", "a", "a"], value=[3, 9, 4])
    assert columns(job, "first", "get", key=["a", "b"]) == ["x", "y"]
    assert columns(job, "mx", "get", key=["a"]) == [9]


def test_a_bad_row_names_itself_and_applies_nothing(job):
    job.register_state(StateDescriptor("s", "reducing", function="sum"))
    with pytest.raises(InvalidValue) as caught:
        columns(job, "s", "add", key=["a", "b", "c"], value=["1", "two", "3"])  # sum adds numbers
    assert caught.value.extra["row"] == 0 and caught.value.detail.startswith("row 0:")
    with pytest.raises(InvalidValue) as caught:
        columns(job, "s", "add", key=["a", "b", "c"], value=[1, None, 3])
    assert caught.value.extra["row"] == 1
    assert columns(job, "s", "get", key=["a", "b", "c"]) == [None, None, None]


def test_keys_of_another_replica_are_refused_with_the_row(make_catalog):
    catalog = make_catalog(replica_index=0, replica_count=2)
    job, _ = catalog.create("j", 128)
    job.register_state(StateDescriptor("v", "value"))
    keys = [f"k{i}" for i in range(50)]
    with pytest.raises(KeyNotOwned) as caught:
        columns(job, "v", "put", key=keys, value=list(range(50)))
    row = caught.value.extra["row"]
    assert job.keyspace.key_group(keys[row], job.descriptor("v").key_type) not in job.key_group_range
    assert all(job.keyspace.key_group(k, job.descriptor("v").key_type) in job.key_group_range for k in keys[:row])


def states_columns(job, states, op, **cols):
    from statehouse.backends.columns import StatesColumnOp

    with job.transaction() as tx:
        work = StatesColumnOp.parse(states, op, pa.table(cols))
        result = work.apply(tx)
    return None if result is None else work.answer(result).to_pydict()


def test_several_states_over_the_same_rows_are_each_states_operation_in_one_transaction(job):
    """One request over several states is the one-state operation per state, state after state,
    all or nothing: a bad row of the second state leaves the first one untouched."""
    from statehouse.protocol.errors import InvalidArgument

    job.register_state(StateDescriptor("total", "reducing", function="sum"))
    job.register_state(StateDescriptor("events", "reducing", function="sum", value_type="int64"))
    job.register_state(StateDescriptor("mean", "aggregating", function="avg"))
    keys = ["a", "b", "a"]
    added = states_columns(
        job, ["total", "events"], "add_get", key=keys, **{"value:total": [1.5, 2.0, 3.0], "value:events": [1, 1, 1]}
    )
    assert added == {"key": keys, "value:total": [1.5, 2.0, 4.5], "value:events": [1, 1, 2]}
    assert states_columns(job, ["events", "total"], "get", key=["a", "b", "c"]) == {
        "key": ["a", "b", "c"],
        "value:events": [2, 1, None],
        "value:total": [4.5, 2.0, None],
    }
    assert states_columns(job, ["mean"], "add", key=["a"], **{"value:mean": [4]}) is None
    with pytest.raises(InvalidValue, match="cannot add null"):
        states_columns(
            job, ["total", "events"], "add", key=["a", "b"], **{"value:total": [1, 1], "value:events": [1, None]}
        )
    assert columns(job, "total", "get", key=["a", "b"]) == [4.5, 2.0]  # the first state's adds were rolled back
    for states, cols, match in [
        (["total", "total"], {"key": ["a"]}, "each once"),
        ([], {"key": ["a"]}, "each once"),
        (["total"], {"key": ["a"], "value": [1]}, "value:total"),
        (["total", "events"], {"key": ["a"], "value:total": [1]}, "value:events"),
    ]:
        with pytest.raises(InvalidArgument, match=match):
            states_columns(job, states, "add", **cols)
