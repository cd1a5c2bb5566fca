"""The batch endpoint: order, atomicity, JSON/msgpack parity, and a property test against a model."""

import itertools

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.http]

MSGPACK = "application/msgpack"


@pytest.fixture
def job(http, job_name):
    http.put(f"/jobs/{job_name}", json={"max_parallelism": 128})
    for state, descriptor in {
        "v": {"kind": "value"},
        "l": {"kind": "list"},
        "m": {"kind": "map"},
        "c": {"kind": "map", "function": "sum"},
        "s": {"kind": "reducing", "function": "sum"},
        "a": {"kind": "aggregating", "function": "avg"},
    }.items():
        assert http.put(f"/jobs/{job_name}/states/{state}", json=descriptor).status_code == 201
    return f"/jobs/{job_name}"


def batch(http, job, ops, *, binary=False):
    if binary:
        r = http.post(
            f"{job}/batch",
            content=msgpack.packb({"ops": ops}, use_bin_type=True),
            headers={"content-type": MSGPACK, "accept": MSGPACK},
        )
        if r.status_code == 200:
            assert r.headers["content-type"] == MSGPACK
            return r.status_code, msgpack.unpackb(r.content, raw=False)
        return r.status_code, r.json()
    r = http.post(f"{job}/batch", json={"ops": ops})
    return r.status_code, r.json()


OPS = [
    {"op": "get", "state": "v", "key": "k"},
    {"op": "put", "state": "v", "key": "k", "value": 1},
    {"op": "get", "state": "v", "key": "k"},
    {"op": "put", "state": "v", "key": "k", "value": {"n": 2}},
    {"op": "get", "state": "v", "key": "k"},
    {"op": "add", "state": "l", "key": "k", "value": "a"},
    {"op": "add", "state": "l", "key": "k", "values": ["b", "c"]},
    {"op": "get", "state": "l", "key": "k"},
    {"op": "map_put", "state": "m", "key": "k", "user_key": "x", "value": 1},
    {"op": "map_contains", "state": "m", "key": "k", "user_key": "x"},
    {"op": "map_get", "state": "m", "key": "k", "user_key": "x"},
    {"op": "map_remove", "state": "m", "key": "k", "user_key": "x"},
    {"op": "map_contains", "state": "m", "key": "k", "user_key": "x"},
    {"op": "add", "state": "s", "key": "k", "value": 5},
    {"op": "add", "state": "s", "key": "k", "value": 6},
    {"op": "get", "state": "s", "key": "k"},
    {"op": "add", "state": "a", "key": "k", "values": [1, 2]},
    {"op": "get", "state": "a", "key": "k"},
    {"op": "clear", "state": "s", "key": "k"},
    {"op": "get", "state": "s", "key": "k"},
    {"op": "put", "state": "v", "key": "k", "value": 3, "ns": "w"},
    {"op": "get", "state": "v", "key": "k", "ns": "w"},
]
EXPECTED = [
    {"value": None}, {}, {"value": 1}, {}, {"value": {"n": 2}}, {}, {}, {"value": ["a", "b", "c"]},
    {}, {"value": True}, {"value": 1}, {}, {"value": False}, {}, {}, {"value": 11}, {}, {"value": 1.5},
    {}, {"value": None}, {}, {"value": 3},
]  # fmt: skip


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
def test_ops_apply_in_order_and_see_earlier_ops(http, job, binary):
    status, body = batch(http, job, OPS, binary=binary)
    assert status == 200, body
    assert body == {"results": EXPECTED}


def test_msgpack_carries_bytes_and_json_reads_them_as_base64(http, job):
    status, _ = batch(http, job, [{"op": "put", "state": "v", "key": "b", "value": b"\x00\xff"}], binary=True)
    assert status == 200
    assert batch(http, job, [{"op": "get", "state": "v", "key": "b"}], binary=True)[1] == {
        "results": [{"value": b"\x00\xff"}]
    }
    assert http.get(f"{job}/states/v/keys/b").json() == {"value": "AP8="}


def test_a_failing_op_applies_nothing_and_names_its_index(http, job):
    batch(http, job, [{"op": "put", "state": "v", "key": "k", "value": "before"}])
    ops = [
        {"op": "put", "state": "v", "key": "k", "value": "after"},
        {"op": "add", "state": "l", "key": "k", "value": 1},
        {"op": "map_put", "state": "m", "key": "k", "user_key": "u", "value": 1},
        {"op": "add", "state": "s", "key": "k", "value": "not a number"},
    ]
    for binary in (False, True):
        status, problem = batch(http, job, ops, binary=binary)
        assert status == 422
        assert problem["op_index"] == 3 and problem["detail"].startswith("op 3:")
        assert problem["code"] == "invalid_value"
    status, body = batch(
        http,
        job,
        [
            {"op": "get", "state": "v", "key": "k"},
            {"op": "get", "state": "l", "key": "k"},
            {"op": "get", "state": "m", "key": "k"},
        ],
    )
    assert body["results"] == [{"value": "before"}, {"value": None}, {"value": None}]


def test_the_first_failing_op_is_named_though_each_state_runs_its_ops_together(http, job):
    ops = [
        {"op": "add", "state": "s", "key": "k", "value": 1},
        {"op": "add", "state": "s", "key": "j", "value": 2},
        {"op": "add", "state": "v", "key": "k", "value": 1},  # the first failure: value states take no add
        {"op": "add", "state": "s", "key": "k", "value": "x"},  # fails too, in the run of state s
        {"op": "add", "state": "s", "key": "k", "value": 3},
    ]
    status, problem = batch(http, job, ops)
    assert (status, problem["code"], problem["op_index"]) == (409, "wrong_state_kind", 2)
    assert problem["detail"].startswith("op 2:")
    ops[2] = {"op": "put", "state": "v", "key": "k", "value": 1}
    status, problem = batch(http, job, ops)
    assert (status, problem["code"], problem["op_index"]) == (422, "invalid_value", 3)
    del ops[3]
    status, body = batch(
        http, job, [*ops, {"op": "get", "state": "s", "key": "k"}, {"op": "get", "state": "v", "key": "k"}]
    )
    assert body["results"] == [{}, {}, {}, {}, {"value": 4}, {"value": 1}]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
def test_map_add_folds_into_entries(http, job, binary):
    ops = [
        {"op": "map_add", "state": "c", "key": "alice", "user_key": "book", "value": 1},
        {"op": "map_add", "state": "c", "key": "alice", "user_key": "book", "values": [2, 3]},
        {"op": "map_add", "state": "c", "key": "alice", "user_key": "pen", "value": 1, "ns": "w"},
        {"op": "map_get", "state": "c", "key": "alice", "user_key": "book"},
        {"op": "get", "state": "c", "key": "alice", "ns": "w"},
    ]
    status, body = batch(http, job, ops, binary=binary)
    assert status == 200, body
    assert body == {"results": [{}, {}, {}, {"value": 6}, {"value": {"pen": 1}}]}


def test_map_add_failures_apply_nothing(http, job):
    add = {"op": "map_add", "state": "c", "key": "k", "user_key": "u"}
    cases = [
        ([{**add, "value": 1}, {**add, "state": "m", "value": 1}], 409, "wrong_state_kind"),  # map without function
        ([{**add, "value": 1}, {**add, "state": "s", "value": 1}], 409, "wrong_state_kind"),
        ([{**add, "value": 1}, {**add, "value": "x"}], 422, "invalid_value"),
        ([{**add, "value": 1}, {**add, "value": 1, "values": [1]}], 422, "invalid_argument"),
        ([{**add, "value": 1}, {"op": "map_add", "state": "c", "key": "k", "value": 1}], 422, "invalid_argument"),
    ]
    for ops, status, code in cases:
        got, problem = batch(http, job, ops)
        assert (got, problem["code"], problem["op_index"]) == (status, code, 1), problem
    assert batch(http, job, [{"op": "get", "state": "c", "key": "k"}])[1] == {"results": [{"value": None}]}


def test_response_format_follows_accept(http, job):
    r = http.post(f"{job}/batch", json={"ops": [{"op": "get", "state": "v", "key": "x"}]}, headers={"accept": MSGPACK})
    assert r.headers["content-type"] == MSGPACK
    assert msgpack.unpackb(r.content) == {"results": [{"value": None}]}
    r = http.post(
        f"{job}/batch",
        content=msgpack.packb({"ops": []}),
        headers={"content-type": MSGPACK, "accept": "application/json"},
    )
    assert r.json() == {"results": []}


# -- property test: random op sequences against an in-memory reference model ------------

KEYS = st.sampled_from(["a", "b", "c"])
NS = st.sampled_from(["", "w"])
SCALARS = st.one_of(st.integers(-1000, 1000), st.text(max_size=5), st.booleans())
OP = st.one_of(
    st.fixed_dictionaries({"op": st.just("put"), "state": st.just("v"), "key": KEYS, "ns": NS, "value": SCALARS}),
    st.fixed_dictionaries({"op": st.just("get"), "state": st.sampled_from("vlmcsa"), "key": KEYS, "ns": NS}),
    st.fixed_dictionaries({"op": st.just("clear"), "state": st.sampled_from("vlmcsa"), "key": KEYS, "ns": NS}),
    st.fixed_dictionaries({"op": st.just("add"), "state": st.just("l"), "key": KEYS, "ns": NS, "value": SCALARS}),
    st.fixed_dictionaries(
        {"op": st.just("add"), "state": st.sampled_from("sa"), "key": KEYS, "ns": NS, "value": st.integers(-50, 50)}
    ),
    st.fixed_dictionaries(
        {"op": st.just("map_put"), "state": st.just("m"), "key": KEYS, "ns": NS, "user_key": KEYS, "value": SCALARS}
    ),
    st.fixed_dictionaries(
        {"op": st.just("map_add"), "state": st.just("c"), "key": KEYS, "ns": NS, "user_key": KEYS,
         "value": st.integers(-50, 50)}
    ),
    st.fixed_dictionaries(
        {"op": st.sampled_from(["map_get", "map_remove", "map_contains"]), "state": st.sampled_from("mc"),
         "key": KEYS, "ns": NS, "user_key": KEYS}
    ),
)  # fmt: skip


class Model:
    """What Flink's state semantics say each op returns."""

    def __init__(self):
        self.data = {}

    def apply(self, op):
        slot = (op["state"], op["key"], op["ns"])
        current = self.data.get(slot)
        name, state = op["op"], op["state"]
        if name == "get":
            if state == "a" and current is not None:
                return {"value": current[0] / current[1]}
            return {"value": current}
        if name == "clear":
            self.data.pop(slot, None)
        elif name == "put":
            self.data[slot] = op["value"]
        elif name == "add" and state == "l":
            self.data[slot] = [*(current or []), op["value"]]
        elif name == "add" and state == "s":
            self.data[slot] = op["value"] + (current or 0)
        elif name == "add" and state == "a":
            total, count = current or (0, 0)
            self.data[slot] = (total + op["value"], count + 1)
        elif name == "map_put":
            self.data[slot] = {**(current or {}), op["user_key"]: op["value"]}
        elif name == "map_add":
            entries = current or {}
            self.data[slot] = {**entries, op["user_key"]: entries.get(op["user_key"], 0) + op["value"]}
        elif name == "map_get":
            return {"value": (current or {}).get(op["user_key"])}
        elif name == "map_contains":
            return {"value": op["user_key"] in (current or {})}
        elif name == "map_remove":
            remaining = {k: v for k, v in (current or {}).items() if k != op["user_key"]}
            self.data[slot] = remaining or None
            if not remaining:
                self.data.pop(slot)
        return {}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(OP, max_size=30), min_size=1, max_size=4), binary=st.booleans())
def test_random_batches_match_the_model(http, batches, binary):
    name = f"prop-{next(_prop_jobs)}"
    job = f"/jobs/{name}"
    http.put(job, json={"max_parallelism": 128})
    for state, descriptor in {"v": "value", "l": "list", "m": "map"}.items():
        http.put(f"{job}/states/{state}", json={"kind": descriptor})
    http.put(f"{job}/states/c", json={"kind": "map", "function": "sum"})
    http.put(f"{job}/states/s", json={"kind": "reducing", "function": "sum"})
    http.put(f"{job}/states/a", json={"kind": "aggregating", "function": "avg"})
    model = Model()
    for ops in batches:
        status, body = batch(http, job, ops, binary=binary)
        assert status == 200, body
        assert body["results"] == [model.apply(op) for op in ops]
    http.delete(job)


_prop_jobs = itertools.count()
