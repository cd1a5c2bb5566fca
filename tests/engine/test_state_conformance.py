"""One conformance suite for every backend and every door of the engine (one key, batch and
columnar, through ``tests/support/doors.py``): state kinds, namespaces, TTL, atomicity, ownership,
operator state and consistent frozen views.

No case passes by falling back: a step the columnar door cannot carry (values no one Arrow
column holds) is declared on its case with ``@not_columnar(op, ...)``, and the suite checks
that the columnar door refused exactly those steps, each with a message, and nothing else."""

import pytest

from statehouse.backends import ops
from statehouse.backends.errors import JobConflict, KeyNotOwned, OperatorStateConflict, StateNotFound, WrongStateKind
from statehouse.protocol.errors import IncompatibleState, InvalidArgument, InvalidKey, InvalidName, InvalidValue
from statehouse.protocol.keygroups import assign_to_key_group
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.ttl import MAX_LONG, TtlConfig, expiration_timestamp, is_expired
from tests.support.doors import DOORS, through

# The columnar door's declared refusals of a case, in order: @not_columnar("put", "get").
not_columnar = pytest.mark.not_columnar


def register(job, name, kind, **kwargs):
    job.register_state(StateDescriptor(name, kind, **kwargs))


_door: dict = {"name": "one_key", "refusals": []}


@pytest.fixture(autouse=True, params=DOORS)
def door(request):
    """Which door keyed-state calls take: ``run`` hands the test a transaction of that door.
    Through the columnar door, the steps it refused must be exactly the declared ones."""
    refusals: list[tuple[str, str]] = []
    _door.update(name=request.param, refusals=refusals)
    yield request.param
    _door.update(name="one_key", refusals=[])
    declared = request.node.get_closest_marker("not_columnar")
    expected = list(declared.args) if declared and request.param == "columnar" else []
    assert [op for op, _message in refusals] == expected, refusals
    assert all(message for _op, message in refusals)


def run(job, fn):
    with job.transaction() as tx:
        return fn(through(tx, _door["name"], _door["refusals"]))


# -- state kinds -------------------------------------------------------------------------


@not_columnar("put", "get")  # {"a": [1, 2.5, "x", None, True]}: a list of mixed types
def test_value_state(job):
    register(job, "v", "value")
    assert run(job, lambda tx: tx.value("v").get("k")) is None
    run(job, lambda tx: tx.value("v").update("k", {"a": [1, 2.5, "x", None, True]}))
    assert run(job, lambda tx: tx.value("v").get("k")) == {"a": [1, 2.5, "x", None, True]}
    run(job, lambda tx: tx.value("v").update("k", b"\x00bytes"))
    assert run(job, lambda tx: tx.value("v").get("k")) == b"\x00bytes"
    run(job, lambda tx: tx.value("v").clear("k"))
    assert run(job, lambda tx: tx.value("v").get("k")) is None
    run(job, lambda tx: tx.value("v").update("k", 5))
    run(job, lambda tx: tx.value("v").update("k", None))  # Flink: update(null) clears
    assert run(job, lambda tx: tx.value("v").get("k")) is None


def test_value_default(job):
    register(job, "v", "value", default=0)
    assert run(job, lambda tx: tx.value("v").get("k")) == 0


@not_columnar("add", "get")  # add_all [2, "three", [4]]: ints beside strings and lists
def test_list_state(job):
    register(job, "l", "list")
    assert run(job, lambda tx: tx.list("l").get("k")) is None
    run(job, lambda tx: tx.list("l").add("k", 1))
    run(job, lambda tx: tx.list("l").add_all("k", [2, "three", [4]]))
    assert run(job, lambda tx: tx.list("l").get("k")) == [1, 2, "three", [4]]
    run(job, lambda tx: tx.list("l").update("k", [9]))
    assert run(job, lambda tx: tx.list("l").get("k")) == [9]
    run(job, lambda tx: tx.list("l").update("k", []))
    assert run(job, lambda tx: tx.list("l").get("k")) is None
    run(job, lambda tx: tx.list("l").add("k", 1))
    run(job, lambda tx: tx.list("l").clear("k"))
    assert run(job, lambda tx: tx.list("l").get("k")) is None
    with pytest.raises(InvalidValue):
        run(job, lambda tx: tx.list("l").add("k", None))


# put_all {"a": 1, "c": {"x": 3}}, and every whole-map read of it (entries, keys, values, get_all, keys)
@not_columnar("map_put", "get", "get", "get", "get", "get")
def test_map_state(job):
    register(job, "m", "map")
    m = lambda tx: tx.map("m")  # noqa: E731
    assert run(job, lambda tx: m(tx).is_empty("k"))
    run(job, lambda tx: m(tx).put("k", "b", 2))
    run(job, lambda tx: m(tx).put_all("k", {"a": 1, "c": {"x": 3}}))
    assert run(job, lambda tx: m(tx).get("k", "a")) == 1
    assert run(job, lambda tx: m(tx).get("k", "zzz")) is None
    assert run(job, lambda tx: m(tx).contains("k", "b"))
    assert not run(job, lambda tx: m(tx).contains("k", "zzz"))
    assert run(job, lambda tx: m(tx).entries("k")) == [("a", 1), ("b", 2), ("c", {"x": 3})]
    assert run(job, lambda tx: m(tx).keys("k")) == ["a", "b", "c"]
    assert run(job, lambda tx: m(tx).values("k")) == [1, 2, {"x": 3}]
    assert run(job, lambda tx: m(tx).get_all("k")) == {"a": 1, "b": 2, "c": {"x": 3}}
    run(job, lambda tx: m(tx).remove("k", "b"))
    assert run(job, lambda tx: m(tx).keys("k")) == ["a", "c"]
    run(job, lambda tx: m(tx).update("k", {"z": 26}))
    assert run(job, lambda tx: m(tx).get_all("k")) == {"z": 26}
    run(job, lambda tx: m(tx).clear("k"))
    assert run(job, lambda tx: m(tx).get_all("k")) is None
    assert run(job, lambda tx: m(tx).is_empty("k"))
    with pytest.raises(InvalidValue):
        run(job, lambda tx: m(tx).put("k", "a", None))


def test_map_put_all_puts_each_entry(job):
    """Several entries of one type in one call: one columnar request of several rows."""
    register(job, "m", "map")
    entries = {"a": 1, "b": 2, "c": 3, "d": 4}
    run(job, lambda tx: tx.map("m").put_all("k", entries))
    run(job, lambda tx: tx.map("m").put_all("k", {"b": 20, "e": 5}, namespace="w"))
    assert [run(job, lambda tx, u=u: tx.map("m").get("k", u)) for u in entries] == [1, 2, 3, 4]
    assert run(job, lambda tx: tx.map("m").get_all("k")) == entries
    assert run(job, lambda tx: tx.map("m").get_all("k", "w")) == {"b": 20, "e": 5}


@pytest.mark.parametrize(
    ("function", "inputs", "expected"),
    [("sum", [1, 2, 3.5], 6.5), ("min", [3, 1, 2], 1), ("max", ["b", "c", "a"], "c"), ("count", ["x", {}], 2),
     ("first", [7, 8], 7), ("last", [7, 8], 8)],
)  # fmt: skip
def test_reducing_state(job, function, inputs, expected):
    register(job, "r", "reducing", function=function)
    assert run(job, lambda tx: tx.reducing("r").get("k")) is None
    for value in inputs:
        run(job, lambda tx, value=value: tx.reducing("r").add("k", value))
    assert run(job, lambda tx: tx.reducing("r").get("k")) == expected
    run(job, lambda tx: tx.reducing("r").clear("k"))
    assert run(job, lambda tx: tx.reducing("r").get("k")) is None


@pytest.mark.parametrize(
    ("function", "inputs", "expected"),
    [("avg", [1, 2, 6], 3.0), ("count", [5, 5], 2), ("sum", [1, 2], 3), ("min", [2, 1], 1), ("max", [2, 1], 2),
     ("summary", [4, 1, 7], {"count": 3, "sum": 12, "min": 1, "max": 7, "avg": 4.0})],
)  # fmt: skip
def test_aggregating_state(job, function, inputs, expected):
    register(job, "a", "aggregating", function=function)
    run(job, lambda tx: tx.aggregating("a").add_all("k", inputs))
    assert run(job, lambda tx: tx.aggregating("a").get("k")) == expected


def test_function_input_validation(job):
    register(job, "s", "reducing", function="sum")
    register(job, "mx", "reducing", function="max")
    run(job, lambda tx: tx.reducing("s").add("k", 1))
    for bad in ("x", True, None, [1]):
        with pytest.raises(InvalidValue):
            run(job, lambda tx, bad=bad: tx.reducing("s").add("k", bad))
    assert run(job, lambda tx: tx.reducing("s").get("k")) == 1
    run(job, lambda tx: tx.reducing("mx").add("k", 1))
    with pytest.raises(InvalidValue):
        run(job, lambda tx: tx.reducing("mx").add("k", "a"))


def test_an_int64_sum_stays_an_int64(job):
    """A typed sum refuses the add that would leave int64 (it was stored as 2**63, past what an
    int64 column can answer), with the row named; the sum keeps its last value."""
    register(job, "s", "reducing", function="sum", value_type="int64")
    register(job, "m", "map", function="sum", value_type="int64")
    top = 2**63 - 1
    run(job, lambda tx: tx.reducing("s").add("k", top))
    for add in (lambda tx: tx.reducing("s").add("k", 1), lambda tx: tx.reducing("s").add_all("j", [top, 5])):
        with pytest.raises(InvalidValue, match="does not fit int64"):
            run(job, add)
    with pytest.raises(InvalidValue, match="does not fit int64"):
        run(job, lambda tx: tx.map("m").add_all("k", "a", [-(2**63), -1]))
    assert run(job, lambda tx: tx.reducing("s").get("k")) == top
    assert run(job, lambda tx: tx.reducing("s").get("j")) is None
    assert run(job, lambda tx: tx.map("m").get("k", "a")) is None
    run(job, lambda tx: tx.reducing("s").add_all("j", [top, -5]))  # ints that stay in range
    assert run(job, lambda tx: tx.reducing("s").get("j")) == top - 5


@pytest.mark.parametrize(
    ("kind", "function", "inputs", "answers"),
    [("reducing", "sum", [1, 2, 3.5], [1, 3, 6.5]), ("reducing", "max", [3, 1, 7], [3, 3, 7]),
     ("aggregating", "avg", [1, 2, 6], [1.0, 1.5, 3.0]), ("aggregating", "count", [5, 5], [1, 2]),
     ("aggregating", "summary", [4, 1], [{"count": 1, "sum": 4, "min": 4, "max": 4, "avg": 4.0},
                                         {"count": 2, "sum": 5, "min": 1, "max": 4, "avg": 2.5}])],
)  # fmt: skip
def test_add_get_answers_the_result_after_each_add(job, kind, function, inputs, answers):
    """``add_get`` is ``add`` and then ``get`` in one operation: each add answers what a get
    would read next; several values in one request answer the result after the last."""
    register(job, "r", kind, function=function)
    state = lambda tx: getattr(tx, kind)("r")  # noqa: E731
    for value, answer in zip(inputs, answers, strict=True):
        assert run(job, lambda tx, value=value: state(tx).add_get("k", value)) == answer
        assert run(job, lambda tx: state(tx).get("k")) == answer
    assert run(job, lambda tx: state(tx).add_get_all("j", inputs, namespace="w")) == answers[-1]
    assert run(job, lambda tx: state(tx).get("j", "w")) == answers[-1]
    assert run(job, lambda tx: state(tx).get("j")) is None


@not_columnar("add_get", "add_get")  # [5, "x"] and [5, 2**63]: no one Arrow column holds them
def test_add_get_refuses_other_kinds_and_bad_values_and_applies_nothing(job, door):
    register(job, "s", "reducing", function="sum", value_type="int64")
    register(job, "l", "list")
    register(job, "v", "value")
    run(job, lambda tx: tx.reducing("s").add("k", 1))
    for bad in ("x", None, 2**63):
        with pytest.raises(InvalidValue):
            run(job, lambda tx, bad=bad: tx.reducing("s").add_get_all("k", [5, bad]))
    assert run(job, lambda tx: tx.reducing("s").get("k")) == 1
    for other in ("l", "v"):
        with pytest.raises(WrongStateKind, match="'add_get' does not apply"):
            run(job, lambda tx, other=other: _any_kind(tx, other).add_get("k", 1))
    if door != "columnar":  # a columnar request of no rows answers no rows
        with pytest.raises(InvalidArgument, match="at least one value"):
            run(job, lambda tx: tx.reducing("s").add_get_all("k", []))


def _any_kind(tx, name):
    """A state of any kind as its door takes calls; the one-key door's typed objects have no
    ``add_get`` where the kind refuses it, so there the one-key route's own entry answers."""
    if hasattr(tx, "run"):
        return tx.state(name)

    class OneKey:
        def add_get(self, key, value):
            return ops.apply(tx, {"op": "add_get", "state": name, "key": key, "value": value})["value"]

    return OneKey()


def test_add_get_never_folds_into_an_expired_accumulator(job, clock):
    register(job, "s", "reducing", function="sum", ttl=ttl(visibility="return_expired_if_not_cleaned_up"))
    assert run(job, lambda tx: tx.reducing("s").add_get("k", 5)) == 5
    clock.now = 1100
    assert run(job, lambda tx: tx.reducing("s").add_get("k", 1)) == 1
    assert run(job, lambda tx: tx.reducing("s").get("k")) == 1


@pytest.mark.parametrize(
    ("function", "inputs", "expected"),
    [("sum", [1, 2, 3.5], 6.5), ("min", [3, 1, 2], 1), ("max", ["b", "c", "a"], "c"),
     pytest.param("count", ["x", {}, 1], 3, marks=not_columnar("map_add"))],  # add_all of mixed values
)  # fmt: skip
def test_map_add_folds_into_one_entry(job, function, inputs, expected):
    register(job, "m", "map", function=function)
    m = lambda tx: tx.map("m")  # noqa: E731
    for value in inputs:
        run(job, lambda tx, value=value: m(tx).add("k", "book", value))
    run(job, lambda tx: m(tx).add_all("k", "pen", inputs, namespace="w"))
    assert run(job, lambda tx: m(tx).get("k", "book")) == expected  # the stored value is the result
    assert run(job, lambda tx: m(tx).get_all("k", "w")) == {"pen": expected}
    assert run(job, lambda tx: m(tx).get_all("k")) == {"book": expected}  # other entries and namespaces untouched


def test_map_add_next_to_put_and_remove(job):
    register(job, "m", "map", function="sum")
    m = lambda tx: tx.map("m")  # noqa: E731
    run(job, lambda tx: m(tx).put("k", "a", 10))
    run(job, lambda tx: (m(tx).add("k", "a", 5), m(tx).add("k", "b", 1)))  # a transaction sees its own adds
    assert run(job, lambda tx: m(tx).get_all("k")) == {"a": 15, "b": 1}
    run(job, lambda tx: m(tx).remove("k", "a"))
    run(job, lambda tx: m(tx).add("k", "a", 2))
    assert run(job, lambda tx: m(tx).get("k", "a")) == 2
    run(job, lambda tx: m(tx).add_all("k", "c", []))  # nothing to add: no entry
    assert not run(job, lambda tx: m(tx).contains("k", "c"))


@not_columnar("map_add")  # add_all [1, "x"]: an int beside a string
def test_map_add_refuses_bad_values_and_applies_nothing(job):
    register(job, "m", "map", function="sum")
    m = lambda tx: tx.map("m")  # noqa: E731
    run(job, lambda tx: m(tx).add("k", "a", 1))
    for bad in ("x", True, None, [1]):
        with pytest.raises(InvalidValue):
            run(job, lambda tx, bad=bad: m(tx).add("k", "a", bad))
    with pytest.raises(InvalidValue):  # one bad value in add_all: nothing of it is added
        run(job, lambda tx: m(tx).add_all("k", "a", [1, "x"]))
    assert run(job, lambda tx: m(tx).get("k", "a")) == 1
    run(job, lambda tx: m(tx).put("k", "s", "text"))  # map_put may store what sum cannot fold into
    with pytest.raises(InvalidValue, match="stored str"):
        run(job, lambda tx: m(tx).add("k", "s", 1))
    register(job, "mx", "map", function="max")
    run(job, lambda tx: tx.map("mx").put("k", "a", {"not": "comparable"}))
    with pytest.raises(InvalidValue, match="stored dict"):
        run(job, lambda tx: tx.map("mx").add("k", "a", 1))


def test_map_add_needs_a_map_with_function(job):
    register(job, "plain", "map")
    register(job, "r", "reducing", function="sum")
    run(job, lambda tx: tx.map("plain").put("k", "a", 1))
    with pytest.raises(WrongStateKind, match="register it again with 'function'"):
        run(job, lambda tx: tx.map("plain").add("k", "a", 1))
    with pytest.raises(WrongStateKind):
        run(job, lambda tx: tx.map("r"))
    # A map without function may gain one; its entries are kept and map_add then works.
    assert job.register_state(StateDescriptor("plain", "map", function="sum")) is False
    assert job.descriptor("plain").function == "sum"
    run(job, lambda tx: tx.map("plain").add("k", "a", 2))
    assert run(job, lambda tx: tx.map("plain").get("k", "a")) == 3


def test_map_function_registration_rules(job):
    register(job, "m", "map", function="count")
    assert job.register_state(StateDescriptor("m", "map", function="count")) is False
    for other in ("sum", None):  # another function, or dropping it, stays incompatible
        with pytest.raises(IncompatibleState):
            register(job, "m", "map", function=other)
    register(job, "n", "map")
    with pytest.raises(IncompatibleState):  # gaining a function excuses no other change
        register(job, "n", "map", function="sum", key_type="int")
    for aggregating in ("avg", "summary"):
        with pytest.raises(InvalidArgument, match="use an aggregating state"):
            StateDescriptor("x", "map", function=aggregating)
    with pytest.raises(InvalidArgument, match="one of: count, first, last, max, min, sum"):
        StateDescriptor("x", "map", function="median")


# -- keys, namespaces, descriptors -------------------------------------------------------


def test_namespaces_are_separate(job):
    register(job, "v", "value")
    register(job, "m", "map")
    run(job, lambda tx: tx.value("v").update("k", "void"))
    run(job, lambda tx: tx.value("v").update("k", "w1", namespace="window-1"))
    run(job, lambda tx: tx.map("m").put("k", "a", 1, namespace="window-1"))
    assert run(job, lambda tx: tx.value("v").get("k")) == "void"
    assert run(job, lambda tx: tx.value("v").get("k", "window-1")) == "w1"
    assert run(job, lambda tx: tx.map("m").get_all("k")) is None
    assert run(job, lambda tx: tx.map("m").get_all("k", "window-1")) == {"a": 1}
    run(job, lambda tx: tx.value("v").clear("k", "window-1"))
    assert run(job, lambda tx: tx.value("v").get("k")) == "void"


@pytest.mark.parametrize(("key_type", "keys"), [("int", [0, -1, 42, 2**31 - 1]), ("long", [-1, 1 << 32, -(2**63)])])
@not_columnar("get")  # the key 2**64: no Arrow integer holds it
def test_numeric_keys(job, key_type, keys):
    register(job, "v", "value", key_type=key_type)
    for k in keys:
        run(job, lambda tx, k=k: tx.value("v").update(k, str(k)))
    for k in keys:
        assert run(job, lambda tx, k=k: tx.value("v").get(k)) == str(k)
    assert sorted(e.key for e in job.keys("v")) == sorted(keys)
    with pytest.raises(InvalidKey):
        run(job, lambda tx: tx.value("v").get("not-a-number"))
    with pytest.raises(InvalidKey):
        run(job, lambda tx: tx.value("v").get(2**64))


def test_key_listing_by_state_namespace_and_key_group(job):
    register(job, "m", "map")
    keys = [f"user-{i}" for i in range(50)]
    for k in keys:
        run(job, lambda tx, k=k: (tx.map("m").put(k, "a", 1), tx.map("m").put(k, "b", 2)))
    run(job, lambda tx: tx.map("m").put("other", "a", 1, namespace="w"))
    listed = list(job.keys("m"))
    assert sorted(e.key for e in listed) == sorted(keys)  # each key once, though 2 entries
    assert [e.key_group for e in listed] == sorted(e.key_group for e in listed)
    for e in listed:
        assert e.key_group == assign_to_key_group(e.key, "string", 128)
    kg = listed[0].key_group
    assert {e.key for e in job.keys("m", key_group=kg)} == {e.key for e in listed if e.key_group == kg}
    assert [e.key for e in job.keys("m", namespace="w")] == ["other"]
    assert len(list(job.keys("m", namespace=None))) == 51
    resumed = list(job.keys("m", start_after=listed[9].position))
    assert resumed == listed[10:]


def test_descriptor_registration_rules(job):
    register(job, "v", "value")
    assert job.register_state(StateDescriptor("v", "value")) is False  # idempotent
    with pytest.raises(IncompatibleState):
        register(job, "v", "list")
    with pytest.raises(IncompatibleState):
        register(job, "v", "value", key_type="int")
    with pytest.raises(IncompatibleState):
        register(job, "v", "value", ttl=TtlConfig(100))
    register(job, "r", "reducing", function="sum")
    with pytest.raises(IncompatibleState):
        register(job, "r", "reducing", function="max")
    register(job, "t", "value", ttl=TtlConfig(100))
    register(job, "t", "value", ttl=TtlConfig(500))  # a new TTL duration is compatible
    assert job.descriptor("t").ttl.ttl_ms == 500
    for bad in [
        lambda: StateDescriptor("x", "reducing"),
        lambda: StateDescriptor("x", "reducing", function="avg"),
        lambda: StateDescriptor("x", "value", function="sum"),
        lambda: StateDescriptor("x", "list", default=1),
        lambda: StateDescriptor("x", "tree"),
        lambda: StateDescriptor("x", "value", key_type="uuid"),
    ]:
        with pytest.raises(InvalidArgument):
            bad()
    for name in ["", "a/b", "..", "a" * 129, "sp ace", "$meta"]:
        with pytest.raises(InvalidName):
            StateDescriptor(name, "value")


def test_unknown_state_and_wrong_kind(job):
    register(job, "v", "value")
    with pytest.raises(StateNotFound):
        run(job, lambda tx: tx.value("nope"))
    with pytest.raises(WrongStateKind):
        run(job, lambda tx: tx.list("v"))


def test_drop_state(job):
    register(job, "v", "value")
    run(job, lambda tx: tx.value("v").update("k", 1))
    job.drop_state("v")
    with pytest.raises(StateNotFound):
        job.descriptor("v")
    register(job, "v", "list")  # the name is free again, with nothing left behind
    assert run(job, lambda tx: tx.list("v").get("k")) is None


def test_job_max_parallelism_is_fixed(make_catalog):
    catalog = make_catalog()
    job, created = catalog.create("j", 256)
    assert created and job.max_parallelism == 256
    assert catalog.create("j") == (job, False)
    with pytest.raises(JobConflict):
        catalog.create("j", 128)
    default_job, _ = catalog.create("k")
    assert default_job.max_parallelism == 128
    with pytest.raises(InvalidArgument):
        catalog.create("z", 0)
    with pytest.raises(InvalidName):
        catalog.create("../escape")


# -- atomicity ---------------------------------------------------------------------------


def test_transaction_reads_its_own_writes_and_applies_atomically(job):
    register(job, "v", "value")
    register(job, "m", "map")
    register(job, "s", "reducing", function="sum")

    def ops(tx):
        tx.value("v").update("k", 1)
        assert tx.value("v").get("k") == 1
        tx.map("m").put("k", "a", 1)
        tx.map("m").clear("k")
        tx.map("m").put("k", "b", 2)
        assert tx.map("m").get_all("k") == {"b": 2}
        tx.reducing("s").add("k", 5)
        tx.reducing("s").add("k", 6)
        assert tx.reducing("s").get("k") == 11

    run(job, ops)
    assert run(job, lambda tx: (tx.value("v").get("k"), tx.map("m").get_all("k"), tx.reducing("s").get("k"))) == (
        1,
        {"b": 2},
        11,
    )

    def failing(tx):
        tx.value("v").update("k", 2)
        tx.map("m").clear("k")
        tx.reducing("s").add("k", 100)
        tx.reducing("s").add("k", "not a number")

    with pytest.raises(InvalidValue):
        run(job, failing)
    assert run(job, lambda tx: (tx.value("v").get("k"), tx.map("m").get_all("k"), tx.reducing("s").get("k"))) == (
        1,
        {"b": 2},
        11,
    )


# -- ownership ---------------------------------------------------------------------------


def test_ownership_vectors(make_catalog):
    catalog = make_catalog(replica_index=1, replica_count=3)
    job, _ = catalog.create("j", 128)
    register(job, "v", "value", key_type="int")
    # "hello" (string) has key group 35 -> replica 0; int 42 -> key group 29 -> replica 0;
    # int 1 -> key group 86 -> replica 2; int -1 -> key group 80 -> replica 1.
    run(job, lambda tx: tx.value("v").update(-1, "mine"))
    assert run(job, lambda tx: tx.value("v").get(-1)) == "mine"
    for key, kg, owner in [(42, 29, 0), (1, 86, 2)]:
        with pytest.raises(KeyNotOwned) as info:
            run(job, lambda tx, key=key: tx.value("v").update(key, "theirs"))
        assert (info.value.key_group, info.value.owner) == (kg, owner)
        assert f"replica {owner}" in info.value.detail


# -- TTL (reference vectors, ttl = 100 ms) -----------------------------------------------


def ttl(**kwargs):
    return TtlConfig(100, cleanup_incremental_size=0, **kwargs)


def test_ttl_value_expires_at_boundary(job, clock):
    register(job, "v", "value", ttl=ttl())
    run(job, lambda tx: tx.value("v").update("k", "x"))  # t = 1000
    clock.now = 1099
    assert run(job, lambda tx: tx.value("v").get("k")) == "x"
    clock.now = 1100
    assert run(job, lambda tx: tx.value("v").get("k")) is None
    assert (
        job.partition.get("v", job.keyspace.key_group("k", job.descriptor("v").key_type), _primary(job, "v", "k"))
        is None
    )


def _primary(job, state, key, ns=""):
    return job.keyspace.locate(key, job.descriptor(state).key_type, ns)[1]


def test_ttl_on_read_and_write_refreshes(job, clock):
    register(job, "v", "value", ttl=ttl(update_type="on_read_and_write"))
    run(job, lambda tx: tx.value("v").update("k", "x"))
    clock.now = 1050
    assert run(job, lambda tx: tx.value("v").get("k")) == "x"
    clock.now = 1149
    assert run(job, lambda tx: tx.value("v").get("k")) == "x"
    clock.now = 1249
    assert run(job, lambda tx: tx.value("v").get("k")) is None


def test_ttl_on_create_and_write_does_not_refresh_on_read(job, clock):
    register(job, "v", "value", ttl=ttl())
    run(job, lambda tx: tx.value("v").update("k", "x"))
    clock.now = 1050
    assert run(job, lambda tx: tx.value("v").get("k")) == "x"
    clock.now = 1100
    assert run(job, lambda tx: tx.value("v").get("k")) is None


def test_ttl_return_expired_if_not_cleaned_up(job, clock):
    register(job, "v", "value", ttl=ttl(visibility="return_expired_if_not_cleaned_up"))
    run(job, lambda tx: tx.value("v").update("k", "x"))
    clock.now = 1100
    assert run(job, lambda tx: tx.value("v").get("k")) == "x"  # returned once, and cleared
    clock.now = 1101
    assert run(job, lambda tx: tx.value("v").get("k")) is None


def add_a_at_0_and_b_at_50(job, clock):
    """The reference's list TTL vector: element a added at t=0, b at t=50."""
    clock.now = 0
    run(job, lambda tx: tx.list("l").add("k", "a"))
    clock.now = 50
    run(job, lambda tx: tx.list("l").add("k", "b"))


def test_ttl_list_elements_expire_individually(job, clock):
    register(job, "l", "list", ttl=ttl())
    add_a_at_0_and_b_at_50(job, clock)
    clock.now = 120
    assert run(job, lambda tx: tx.list("l").get("k")) == ["b"]
    kg = job.keyspace.key_group("k", job.descriptor("l").key_type)
    assert job.partition.get("l", kg, _primary(job, "l", "k")) is not None  # a is still stored
    clock.now = 150
    assert run(job, lambda tx: tx.list("l").get("k")) is None
    assert job.partition.get("l", kg, _primary(job, "l", "k")) is None  # and the list is cleared


def test_ttl_list_on_read_and_write_rewrites_unexpired(job, clock):
    register(job, "l", "list", ttl=ttl(update_type="on_read_and_write"))
    add_a_at_0_and_b_at_50(job, clock)
    clock.now = 120
    assert run(job, lambda tx: tx.list("l").get("k")) == ["b"]  # b refreshed to 120
    clock.now = 219
    assert run(job, lambda tx: tx.list("l").get("k")) == ["b"]


def test_ttl_map_entries_expire_individually(job, clock):
    register(job, "m", "map", ttl=ttl())
    clock.now = 0
    run(job, lambda tx: tx.map("m").put("k", "old", 1))
    clock.now = 60
    run(job, lambda tx: tx.map("m").put("k", "new", 2))
    clock.now = 100
    assert run(job, lambda tx: tx.map("m").get("k", "old")) is None
    assert not run(job, lambda tx: tx.map("m").contains("k", "old"))
    assert run(job, lambda tx: tx.map("m").get_all("k")) == {"new": 2}
    clock.now = 160
    assert run(job, lambda tx: tx.map("m").is_empty("k"))
    kg = job.keyspace.key_group("k", job.descriptor("m").key_type)
    assert list(job.partition.items("m", kg, _primary(job, "m", "k"))) == []  # iteration removed them


def test_ttl_reducing_never_folds_into_expired_accumulator(job, clock):
    register(job, "s", "reducing", function="sum", ttl=ttl(visibility="return_expired_if_not_cleaned_up"))
    run(job, lambda tx: tx.reducing("s").add("k", 5))
    clock.now = 1100
    run(job, lambda tx: tx.reducing("s").add("k", 1))
    assert run(job, lambda tx: tx.reducing("s").get("k")) == 1


def test_ttl_map_add_writes_a_new_timestamp_and_never_folds_into_expired(job, clock):
    register(job, "m", "map", function="sum", ttl=ttl(visibility="return_expired_if_not_cleaned_up"))
    m = lambda tx: tx.map("m")  # noqa: E731
    run(job, lambda tx: m(tx).add("k", "a", 5))  # t = 1000
    clock.now = 1080
    run(job, lambda tx: m(tx).add("k", "a", 1))  # refreshed to 1080, as put does
    clock.now = 1150
    assert run(job, lambda tx: m(tx).get("k", "a")) == 6
    clock.now = 1180
    run(job, lambda tx: m(tx).add("k", "a", 1))  # expired at 1180: starts over
    assert run(job, lambda tx: m(tx).get("k", "a")) == 1
    kg = job.keyspace.key_group("k", job.descriptor("m").key_type)
    clock.now = 1280
    assert run(job, lambda tx: m(tx).get_all("k")) == {"a": 1}  # returned once, and cleared
    assert list(job.partition.items("m", kg, _primary(job, "m", "k"))) == []


def test_expiration_timestamp_is_flinks():
    """``TtlUtils.getExpirationTimestamp``: the one rule reads (``is_expired``) and the scan's
    ``expires_at`` both take, overflow kept at ``Long.MAX_VALUE``; the boundary expires."""
    assert expiration_timestamp(5, 10) == 15 and expiration_timestamp(-20, 10) == -10
    assert expiration_timestamp(MAX_LONG - 3, 10) == MAX_LONG
    assert is_expired(5, 10, 15) and not is_expired(5, 10, 14)
    assert not is_expired(MAX_LONG - 3, 10, MAX_LONG - 1) and is_expired(MAX_LONG - 3, 10, MAX_LONG)


def test_ttl_timestamp_overflow(job, clock):
    max_long = (1 << 63) - 1
    register(job, "v", "value", ttl=ttl())
    clock.now = max_long - 7
    run(job, lambda tx: tx.value("v").update("k", "x"))
    clock.now = max_long - 1
    assert run(job, lambda tx: tx.value("v").get("k")) == "x"
    clock.now = max_long
    assert run(job, lambda tx: tx.value("v").get("k")) is None


def test_ttl_incremental_cleanup_removes_untouched_expired_entries(job, clock):
    register(job, "v", "value", ttl=TtlConfig(100, cleanup_incremental_size=5))
    keys = [f"k{i}" for i in range(20)]
    for k in keys:
        run(job, lambda tx, k=k: tx.value("v").update(k, 1))
    clock.now = 2000
    run(job, lambda tx: tx.value("v").update("fresh", 1))
    for _ in range(10):  # each access checks up to 5 entries; 21 entries in all
        run(job, lambda tx: tx.value("v").get("fresh"))
    assert [e.key for e in job.keys("v")] == ["fresh"]


def test_ttl_cleaner_for_full_snapshots(job, clock):
    from statehouse.backends.keyed import ttl_cleaner

    register(job, "l", "list", ttl=ttl())
    add_a_at_0_and_b_at_50(job, clock)
    kg = job.keyspace.key_group("k", job.descriptor("l").key_type)
    raw = job.partition.get("l", kg, _primary(job, "l", "k"))
    clean = ttl_cleaner(job.descriptor("l"))
    assert clean(raw, 10) is raw
    shorter = clean(raw, 120)
    assert shorter is not None and len(shorter) < len(raw)
    assert clean(raw, 150) is None


# -- operator state ----------------------------------------------------------------------


def test_operator_list_and_broadcast_state(job):
    def write(tx):
        tx.operator.list_update("source", 0, "offsets", [1, 2])
        tx.operator.list_add("source", 0, "offsets", [3])
        tx.operator.list_add("source", 1, "offsets", [10])
        tx.operator.list_update("source", 0, "all", ["u"], mode="union")
        tx.operator.broadcast_put("rules", "config", "threshold", 5)
        tx.operator.broadcast_put("rules", "config", "mode", "strict")

    run(job, write)
    assert run(job, lambda tx: tx.operator.list_get("source", 0, "offsets")) == [1, 2, 3]
    assert run(job, lambda tx: tx.operator.list_get("source", 1, "offsets")) == [10]
    assert run(job, lambda tx: tx.operator.list_get("source", 2, "offsets")) is None
    assert run(job, lambda tx: tx.operator.list_mode("source", "all")) == "union"
    assert run(job, lambda tx: tx.operator.broadcast_entries("rules", "config")) == {"mode": "strict", "threshold": 5}
    run(job, lambda tx: tx.operator.broadcast_remove("rules", "config", "mode"))
    assert run(job, lambda tx: tx.operator.broadcast_get("rules", "config", "mode")) is None
    with pytest.raises(OperatorStateConflict):
        run(job, lambda tx: tx.operator.list_add("source", 0, "offsets", [4], mode="union"))
    with pytest.raises(InvalidName):
        run(job, lambda tx: tx.operator.list_get("../x", 0, "offsets"))


# -- frozen views (the synchronous part of a snapshot) ----------------------------------


def _dump(view, job, table):
    return [entry for kg in job.key_group_range for entry in view.scan(table, kg)]


def test_frozen_view_is_unchanged_by_later_writes(job):
    register(job, "v", "value")
    register(job, "m", "map")
    for i in range(200):
        run(job, lambda tx, i=i: (tx.value("v").update(f"k{i}", i), tx.map("m").put(f"k{i}", "a", i)))
    view = job.partition.freeze()
    before_v, before_m = _dump(view, job, "v"), _dump(view, job, "m")
    live_before = [list(job.partition.scan("m", kg)) for kg in job.key_group_range]
    for i in range(200):
        run(job, lambda tx, i=i: (tx.value("v").update(f"k{i}", -i), tx.map("m").put(f"k{i}", "b", i)))
    run(job, lambda tx: (tx.value("v").update("new", 1), tx.map("m").clear("k1"), tx.map("m").remove("k2", "a")))
    assert _dump(view, job, "v") == before_v
    assert _dump(view, job, "m") == before_m
    assert [list(job.partition.scan("m", kg)) for kg in job.key_group_range] != live_before
    assert run(job, lambda tx: tx.value("v").get("k5")) == -5  # writes were not blocked
    view.release()


def test_two_frozen_views(job):
    register(job, "v", "value")
    run(job, lambda tx: tx.value("v").update("k", 1))
    first = job.partition.freeze()
    run(job, lambda tx: tx.value("v").update("k", 2))
    second = job.partition.freeze()
    run(job, lambda tx: tx.value("v").update("k", 3))
    assert [v for *_k, v in _dump(first, job, "v")] == [b"\x01"]
    assert [v for *_k, v in _dump(second, job, "v")] == [b"\x02"]
    first.release()
    second.release()
    run(job, lambda tx: tx.value("v").update("k", 4))
    assert run(job, lambda tx: tx.value("v").get("k")) == 4


# -- the suite cannot pass by accident -----------------------------------------------------


@pytest.mark.parametrize("door", ["columnar"], indirect=True)
def test_a_broken_columnar_map_put_fails_the_suite(monkeypatch, door):
    """A columnar ``map_put`` that swaps its first two rows' values makes the conformance cases
    fail through the columnar door (and only the map cases)."""
    import pyarrow as pa

    from statehouse.backends.columns import ColumnOp
    from tests.support import doors

    real = doors.apply_columns

    def swapping(tx, op):
        if op.op == "map_put" and op.rows >= 2:
            values = op.columns.column("value")
            swapped = values.take(pa.array([1, 0, *range(2, op.rows)]))
            index = op.columns.column_names.index("value")
            op = ColumnOp.parse(op.state, op.op, op.columns.set_column(index, "value", swapped))
        return real(tx, op)

    monkeypatch.setattr(doors, "apply_columns", swapping)
    failed: list[str] = []

    class Failures:
        def pytest_runtest_logreport(self, report):
            if report.failed:
                failed.append(report.nodeid)

    selection = "columnar-heap and not broken"
    code = pytest.main([__file__, "-q", "-p", "no:cacheprovider", "-k", selection], plugins=[Failures()])
    assert code == pytest.ExitCode.TESTS_FAILED
    assert any("test_map_put_all_puts_each_entry" in node for node in failed), failed
    assert all("map" in node for node in failed), failed
