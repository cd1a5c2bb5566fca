"""The columnar endpoint over HTTP: Arrow in and out, the same rules as the
batch endpoint (one storage format, atomic requests, ownership, limits, fencing, task attempts)."""

import math

import pyarrow as pa
import pytest

from tests.support.arrow_ipc import ARROW, arrow, read, values

pytestmark = [pytest.mark.http]


def post(http, job, state, op, params=None, **columns):
    return http.post(
        f"{job}/states/{state}/columns/{op}", content=arrow(**columns), headers={"content-type": ARROW}, params=params
    )


@pytest.fixture
def job(http, job_name):
    http.put(f"/jobs/{job_name}", json={"max_parallelism": 128}).raise_for_status()
    for name, body in {
        "total": {"kind": "reducing", "function": "sum", "value_type": "float64"},
        "count": {"kind": "reducing", "function": "count"},
        "seen": {"kind": "value"},
        "items": {"kind": "list", "value_type": "string"},
        "tags": {"kind": "map", "function": "sum", "value_type": "int64"},
        "by_id": {"kind": "value", "key_type": "long", "value_type": "int64"},
    }.items():
        http.put(f"/jobs/{job_name}/states/{name}", json=body).raise_for_status()
    return f"/jobs/{job_name}"


def test_reads_answer_the_rows_in_order_with_typed_values(http, job):
    r = post(http, job, "total", "add", key=["a", "b", "a", "c"], value=[1.5, 2.0, 3.0, -1.0])
    assert r.json() == {"op": "add", "rows": 4, "staged": False}
    answer = read(post(http, job, "total", "get", key=["c", "zz", "a", "b"]))
    assert answer.column_names == ["key", "value"]
    assert answer.column("key").to_pylist() == ["c", "zz", "a", "b"]
    assert answer.schema.field("value").type == pa.float64()  # a typed sum: float64, not msgpack bytes
    assert answer.column("value").to_pylist() == [-1.0, None, 4.5, 2.0]


def test_one_storage_format_both_ways(http, job):
    post(http, job, "seen", "put", key=["k1", "k2"], value=[{"x": 1, "y": "z"}, {"x": 2, "y": None}])
    assert http.get(f"{job}/states/seen/keys/k1").json() == {"value": {"x": 1, "y": "z"}}
    http.put(f"{job}/states/seen/keys/k3", json={"value": {"x": 3, "y": "w"}}).raise_for_status()
    assert values(post(http, job, "seen", "get", key=["k3", "k1"])) == [{"x": 3, "y": "w"}, {"x": 1, "y": "z"}]
    http.post(f"{job}/states/total/keys/a/add", json={"value": 2}).raise_for_status()  # an int into a float64 sum
    assert values(post(http, job, "total", "get", key=["a"])) == [2.0]
    http.post(f"{job}/states/items/keys/u/add", json={"values": ["x", "y"]}).raise_for_status()
    post(http, job, "items", "add", key=["u", "u"], value=["z", "w"]).raise_for_status()
    post(http, job, "items", "add", key=["v"], value=pa.array([["p", "q"]])).raise_for_status()  # addAll
    assert http.get(f"{job}/states/items/keys/u").json() == {"value": ["x", "y", "z", "w"]}
    answer = read(post(http, job, "items", "get", key=["u", "v", "none"]))
    assert answer.schema.field("value").type == pa.list_(pa.string())
    assert answer.column("value").to_pylist() == [["x", "y", "z", "w"], ["p", "q"], None]


def test_map_ops(http, job):
    post(
        http, job, "tags", "map_put", key=["u", "u", "v"], user_key=["a", "b", "a"], value=[1, 2, 3]
    ).raise_for_status()
    post(http, job, "tags", "map_add", key=["u", "u"], user_key=["a", "c"], value=[10, 5]).raise_for_status()
    post(http, job, "tags", "map_remove", key=["v"], user_key=["a"]).raise_for_status()
    got = read(post(http, job, "tags", "map_get", key=["u", "u", "u", "v"], user_key=["a", "b", "c", "a"]))
    assert got.schema.field("value").type == pa.int64()
    assert got.column("value").to_pylist() == [11, 2, 5, None]
    whole = read(post(http, job, "tags", "get", key=["u", "v"]))
    assert whole.schema.field("value").type == pa.map_(pa.string(), pa.int64())
    assert [dict(m) if m is not None else None for m in whole.column("value").to_pylist()] == [
        {"a": 11, "b": 2, "c": 5},
        None,
    ]
    assert http.get(f"{job}/states/tags/keys/u").json() == {"value": {"a": 11, "b": 2, "c": 5}}


def test_duplicate_keys_fold_in_row_order_and_clear_in_between(http, job):
    post(http, job, "count", "add", key=["k"] * 5, value=list(range(5))).raise_for_status()
    post(http, job, "seen", "put", key=["k", "k", "k"], value=[1, None, 3]).raise_for_status()
    assert values(post(http, job, "count", "get", key=["k"])) == [5]
    assert values(post(http, job, "seen", "get", key=["k"])) == [3]
    post(http, job, "seen", "put", key=["k", "k"], value=[1, None]).raise_for_status()
    assert values(post(http, job, "seen", "get", key=["k"])) == [None]  # the last row cleared it


def test_large_and_view_strings_are_the_same_strings(http, job):
    """pandas' default string dtype is Arrow large_utf8: keys, user keys and namespaces may come as
    large_utf8 (keys also as string_view) and mean what the same utf8 strings mean."""
    large = pa.large_string()
    post(
        http,
        job,
        "tags",
        "map_put",
        key=pa.array(["u", "v"], large),
        user_key=pa.array(["a", "a"], large),
        value=[1, 2],
    )
    post(http, job, "total", "add", key=pa.array(["u"], pa.string_view()), value=[1.5], ns=pa.array(["n"], large))
    assert values(post(http, job, "tags", "map_get", key=["u", "v"], user_key=["a", "a"])) == [1, 2]
    assert values(post(http, job, "total", "get", key=["u"], ns=["n"])) == [1.5]
    assert http.get(f"{job}/states/tags/keys/v/entries/a").json() == {"value": 2}


def test_namespaces_and_long_keys(http, job):
    post(
        http,
        job,
        "by_id",
        "put",
        key=pa.array([1, -(2**63), 2**63 - 1], pa.int64()),
        value=[1, 2, 3],
        ns=["a", None, "b"],
    )
    assert values(post(http, job, "by_id", "get", key=pa.array([1, 1], pa.int64()), ns=["a", "b"])) == [1, None]
    assert http.get(f"{job}/states/by_id/keys/{-(2**63)}").json() == {"value": 2}
    assert http.get(f"{job}/states/by_id/keys/{2**63 - 1}", params={"ns": "b"}).json() == {"value": 3}


def test_a_bad_row_applies_nothing_and_names_the_row(http, job):
    r = post(http, job, "total", "add", key=["a", "b", "c"], value=[1.0, math.nan, 2.0])
    assert r.status_code == 422 and r.json()["code"] == "invalid_value"
    assert "row 1" in r.json()["detail"]
    r = post(http, job, "by_id", "put", key=pa.array([1, 2], pa.int64()), value=[1.5, 2.5])
    assert r.status_code == 422 and "row 0" in r.json()["detail"] and "int64" in r.json()["detail"]
    assert values(post(http, job, "total", "get", key=["a", "c"])) == [None, None]


@pytest.mark.parametrize(
    ("state", "op", "columns", "status", "code"),
    [
        ("total", "put", {"key": ["a"], "value": [1.0]}, 409, "wrong_state_kind"),
        ("total", "map_get", {"key": ["a"], "user_key": ["x"]}, 409, "wrong_state_kind"),
        ("tags", "add", {"key": ["a"], "value": [1]}, 409, "wrong_state_kind"),
        ("total", "get", {"key": ["a"], "value": [1.0]}, 422, "invalid_argument"),  # a column get does not take
        ("total", "add", {"key": ["a"]}, 422, "invalid_argument"),
        ("total", "get", {"key": pa.array([1], pa.int64())}, 422, "invalid_key"),  # string keys expected
        ("total", "get", {"key": pa.array(["a", None])}, 422, "invalid_key"),
        ("by_id", "get", {"key": ["1"]}, 422, "invalid_key"),
        ("tags", "map_get", {"key": ["a"], "user_key": pa.array([None], pa.string())}, 422, "invalid_argument"),
        ("nope", "get", {"key": ["a"]}, 404, "state_not_found"),
        ("items", "put", {"key": ["a"], "value": ["not a list"]}, 422, "invalid_argument"),
        ("items", "add", {"key": ["a"], "value": pa.array([None], pa.string())}, 422, "invalid_value"),
        ("seen", "put", {"key": ["a" * 5000], "value": [1]}, 413, "key_too_large"),
    ],
)
def test_bad_requests_are_clear_problems(http, job, state, op, columns, status, code):
    r = post(http, job, state, op, **columns)
    assert (r.status_code, r.json()["code"]) == (status, code), r.text
    assert r.headers["content-type"] == "application/problem+json"


def test_bad_bodies(http, job):
    url = f"{job}/states/total/columns/get"
    assert http.post(url, content=b"not arrow", headers={"content-type": ARROW}).json()["code"] == "malformed_body"
    r = http.post(url, content=arrow(key=["a"]), headers={"content-type": "application/json"})
    assert (r.status_code, r.json()["code"]) == (415, "unsupported_media_type")
    assert (
        http.post(
            f"{job}/states/total/columns/explode", content=arrow(key=["a"]), headers={"content-type": ARROW}
        ).status_code
        == 422
    )
    invalid_utf8 = pa.Array.from_buffers(
        pa.string(), 1, [None, pa.py_buffer(b"\x00\x00\x00\x00\x02\x00\x00\x00"), pa.py_buffer(b"\xff\xfe")]
    )
    r = http.post(url, content=arrow(key=invalid_utf8), headers={"content-type": ARROW})
    assert (r.status_code, r.json()["code"]) == (400, "malformed_body")


def test_empty_requests(http, job):
    assert read(post(http, job, "total", "get", key=pa.array([], pa.string()))).num_rows == 0
    r = post(http, job, "total", "add", key=pa.array([], pa.string()), value=pa.array([], pa.float64()))
    assert r.json()["rows"] == 0


def test_fencing_and_task_attempts(http, job):
    assert http.post(f"{job}/fence", json={"epoch": 4}).status_code == 200
    r = post(http, job, "total", "add", params={"epoch": 3}, key=["a"], value=[1.0])
    assert (r.status_code, r.json()["code"]) == (409, "stale_epoch")
    attempt = {"epoch": 4, "partition": 0, "attempt": "t1", "seq": 0}
    r = post(http, job, "total", "add", params=attempt, key=["a", "b", "a"], value=[1.0, 2.0, 3.0])
    assert r.json() == {"op": "add", "rows": 3, "staged": True}
    again = post(http, job, "total", "add", params=attempt, key=["a", "b", "a"], value=[1.0, 2.0, 3.0])
    assert again.json() == r.json()  # a re-sent request: answered again, applied once
    mine = {**attempt, "seq": 1}
    assert values(post(http, job, "total", "get", params=mine, key=["a", "b"])) == [4.0, 2.0]  # read-your-writes
    assert values(post(http, job, "total", "get", key=["a"])) == [None]  # nobody else sees them
    report = http.get(f"{job}/epochs/4").json()
    assert [(a["attempt"], a["ops"]) for a in report["attempts"]] == [("t1", 3)]  # rows count as writes
    body = {"attempts": [{"partition": 0, "attempt": "t1", "ops": 3}]}
    assert http.post(f"{job}/epochs/4/prepare", json=body).status_code == 200
    assert http.post(f"{job}/epochs/4/commit", json=body).json()["ops"] == 3
    assert values(post(http, job, "total", "get", key=["a", "b"])) == [4.0, 2.0]


def test_row_limit(http, job, server):
    limit = 10_000  # the default STATEHOUSE_MAX_BATCH_OPS
    r = post(http, job, "count", "add", key=["k"] * (limit + 1), value=[1] * (limit + 1))
    assert (r.status_code, r.json()["code"]) == (413, "batch_too_large")


@pytest.mark.parametrize(
    "params",
    [{"epoch": "x"}, {"epoch": "-1"}, {"epoch": "1.5"}, {"attempt": "t1"}, {"partition": "0", "seq": "0"},
     {"partition": "0", "attempt": "bad id", "seq": "0"}],
)  # fmt: skip
def test_bad_attempt_parameters_are_refused(http, job, params):
    r = post(http, job, "total", "add", params=params, key=["a"], value=[1.0])
    assert (r.status_code, r.json()["code"]) == (422, "invalid_argument"), r.text
    assert values(post(http, job, "total", "get", key=["a"])) == [None]


def test_maps_inside_values_are_objects_as_at_the_top(http, job):
    """pyarrow gives maps as lists of pairs at any depth; stored, they are what a JSON object is."""
    kind = pa.struct([("m", pa.map_(pa.string(), pa.int64())), ("l", pa.list_(pa.map_(pa.string(), pa.int64())))])
    post(http, job, "seen", "put", key=["k"], value=pa.array([{"m": [("a", 1)], "l": [[("b", 2)]]}], kind))
    assert http.get(f"{job}/states/seen/keys/k").json() == {"value": {"m": {"a": 1}, "l": [{"b": 2}]}}
