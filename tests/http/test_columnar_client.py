"""The columnar client (``client/columns.py``, the handles' ``*_many`` methods, the Spark helpers)
against real servers: two replicas (rows routed to both, answered in the caller's order), a
server with a small row limit (chunking), task attempts (staged, counted in rows, re-sent
requests applied once), and mapInPandas / mapInArrow under ``exactly_once``."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import statehouse.client.arrow as arrow_module
from statehouse.client import ClientConfig, Conflict, InvalidRequest, NotFound, StatehouseClient
from statehouse.client.arrow import ipc_stream
from statehouse.client.attempts import TaskAttempt
from statehouse.client.columns import Columns
from statehouse.client.coordinator import MicroBatchCoordinator
from statehouse.client.spark import BatchContext, exactly_once, with_state_arrow, with_state_pandas
from tests.support.server import start_server

pytestmark = [pytest.mark.http]

STATES = {
    "total": {"kind": "reducing", "function": "sum", "value_type": "float64"},
    "count": {"kind": "reducing", "function": "count"},
    "mean": {"kind": "aggregating", "function": "avg", "value_type": "float64"},
    "last": {"kind": "value"},
    "score": {"kind": "value", "key_type": "long", "value_type": "int64"},
    "level": {"kind": "value", "key_type": "int", "value_type": "float64"},
    "items": {"kind": "list", "value_type": "string"},
    "tags": {"kind": "map", "function": "sum", "value_type": "int64"},
    "props": {"kind": "map"},
}
KEYS = [f"user-{i}" for i in range(200)]


@pytest.fixture
def client(two_replicas):
    with StatehouseClient([s.url for s in two_replicas]) as client:
        yield client


@pytest.fixture
def job(client, job_name):
    job = client.create_job(job_name, max_parallelism=128)
    for name, descriptor in STATES.items():
        descriptor = dict(descriptor)
        job.register(name, descriptor.pop("kind"), **descriptor)
    return job


def routed(job, state, keys):
    """How many of ``keys`` each replica owns (the row-wise client's routing)."""
    counts = [0] * len(job.replicas)
    for key in keys:
        counts[job.replica_for(state, key)] += 1
    return counts


class CountingTransport:
    """Counts the columnar requests (and their rows) each replica receives."""

    def __init__(self, job, monkeypatch):
        self.requests = [[] for _ in job.replicas]
        self.idempotent = []
        for index, replica in enumerate(job.replicas):
            monkeypatch.setattr(replica, "columns", self._wrap(index, replica.columns))

    def _wrap(self, index, send):
        def columns(job, state, op, body, **kwargs):
            rows = pa.ipc.open_stream(pa.py_buffer(bytes(body))).read_all().num_rows
            self.requests[index].append((op, rows, dict(kwargs["params"])))
            self.idempotent.append((op, kwargs["idempotent"]))
            return send(job, state, op, body, **kwargs)

        return columns


# -- routing and order ---------------------------------------------------------------------


def test_rows_go_to_both_replicas_and_reads_answer_in_input_order(job, monkeypatch):
    counting = CountingTransport(job, monkeypatch)
    assert min(routed(job, "last", KEYS)) > 0
    cols = job.columns()
    assert cols.put("last", KEYS, [f"v{i}" for i in range(len(KEYS))]) == len(KEYS)
    assert [sum(rows for _op, rows, _p in r) for r in counting.requests] == routed(job, "last", KEYS)
    assert [len(r) for r in counting.requests] == [1, 1]  # one request per replica
    shuffled = [*np.random.default_rng(7).permutation(KEYS).tolist(), "nobody"]
    got = cols.get("last", shuffled)
    assert got.iloc[:-1].tolist() == [f"v{KEYS.index(k)}" for k in shuffled[:-1]]
    assert got.dtype == "str" and pd.isna(got.iloc[-1])  # pandas' string dtype: absent is NaN
    assert isinstance(got.index, pd.RangeIndex) and got.name == "last"
    # One storage format: the row-wise client reads what the columnar path wrote, and back.
    last = job.value_state("last")
    assert [last.value(k) for k in KEYS[:5]] == ["v0", "v1", "v2", "v3", "v4"]
    last.update("user-3", {"a": 1})
    assert last.get_many(["user-3"]).tolist() == [{"a": 1}]


def test_duplicate_keys_apply_in_row_order(job):
    total, items, last = job.reducing_state("total"), job.list_state("items"), job.value_state("last")
    total.add_many(["a", "b", "a", "a"], [1.0, 2.0, 3.0, 4.0])
    assert total.get_many(["a", "b", "a"]).tolist() == [8.0, 2.0, 8.0]
    items.add_many(["a", "b", "a", "a"], ["x", "y", "z", "w"])
    assert items.get_many(["a", "b"]).tolist() == [["x", "z", "w"], ["y"]]
    last.put_many(["k", "k", "j", "k"], [1, 2, 3, 4])
    assert last.get_many(["k", "j"]).tolist() == [4, 3]
    last.put_many(["k", "k"], [5, None])  # a null clears, and the last row wins
    assert last.get_many(["k"], as_arrow=True).to_pylist() == [None]


# -- every operation on every kind ---------------------------------------------------------


def test_value_state(job):
    last = job.value_state("last")
    assert last.put_many(KEYS, [{"n": i, "tag": "t"} for i in range(len(KEYS))]) == len(KEYS)
    assert last.get_many(KEYS[:3]).tolist() == [{"n": 0, "tag": "t"}, {"n": 1, "tag": "t"}, {"n": 2, "tag": "t"}]
    assert last.value(KEYS[7]) == {"n": 7, "tag": "t"}
    assert last.clear_many(KEYS[:100]) == 100
    got = last.get_many(KEYS)
    assert got[:100].isna().all() and got[100:].notna().all()


def test_list_state(job):
    items = job.list_state("items")
    items.put_many(["a", "b"], [["x", "y"], ["z"]])
    items.add_many(["a", "c"], ["w", "v"])  # one element per row
    items.add_many(["b"], pa.array([["p", "q"]]))  # a list per row: addAll
    assert items.get_many(["a", "b", "c", "d"]).tolist() == [["x", "y", "w"], ["z", "p", "q"], ["v"], None]
    assert items.get("a") == ["x", "y", "w"]
    arrow = items.get_many(["a"], as_arrow=True)
    assert arrow.type == pa.list_(pa.string())
    items.clear_many(["a", "b"])
    assert items.get_many(["a", "b", "c"]).tolist() == [None, None, ["v"]]


def test_map_state(job):
    tags = job.map_state("tags")
    assert tags.put_many(["u", "u", "v"], ["a", "b", "a"], [1, 2, 3]) == 3
    tags.add_many(["u", "u", "w"], ["a", "c", "a"], 10)  # one scalar for every row
    got = tags.get_many(["u", "u", "u", "v", "w", "x"], ["a", "b", "c", "a", "a", "a"])
    assert got.dtype == "Int64" and got.tolist() == [11, 2, 10, 3, 10, pd.NA]
    tags.remove_many(["u"], ["b"])
    assert tags.entries_many(["u", "v", "x"]).tolist() == [{"a": 11, "c": 10}, {"a": 3}, None]
    assert tags.entries("u") == {"a": 11, "c": 10}
    tags.replace_many(["u", "v"], [{"z": 1}, {"y": 2, "x": 3}])
    assert tags.entries_many(["u", "v"]).tolist() == [{"z": 1}, {"x": 3, "y": 2}]
    tags.clear_many(["u"])
    assert tags.entries_many(["u", "v"]).tolist() == [None, {"x": 3, "y": 2}]
    props = job.map_state("props")  # untyped: dict values of one type travel as an Arrow map
    props.replace_many(["p"], [{"color": "red", "size": "L"}])
    props.put_many(["p"], ["shape"], ["round"])
    assert props.entries("p") == {"color": "red", "size": "L", "shape": "round"}
    entries = props.get_many(["p", "p"], ["size", "nope"])
    assert entries.iloc[0] == "L" and pd.isna(entries.iloc[1])


def test_reducing_and_aggregating_states(job):
    total, count, mean = job.reducing_state("total"), job.reducing_state("count"), job.aggregating_state("mean")
    total.add_many(KEYS, np.arange(len(KEYS), dtype=np.float64))
    total.add_many(KEYS[:100], 1)  # an int into a float64 sum
    total.add_many(KEYS[100:], np.int64(1))  # a numpy scalar
    count.add_many(KEYS[:10], "anything")
    mean.add_many(["m", "m", "m"], [1.0, 2.0, 6.0])
    got = total.get_many([*KEYS, "none"])
    assert got.dtype == np.float64 and got.iloc[:-1].tolist() == [i + 1.0 for i in range(len(KEYS))]
    assert np.isnan(got.iloc[-1])
    counted = count.get_many(KEYS[:11])
    assert counted.dtype == "Int64" and counted.tolist() == [1] * 10 + [pd.NA]
    assert mean.get_many(["m"]).tolist() == [3.0]
    total.clear_many(KEYS[:5])
    assert total.get_many(KEYS[:6]).isna().tolist() == [True] * 5 + [False]


# -- namespaces, input kinds, types ----------------------------------------------------------


def test_namespaces_one_for_all_rows_or_one_per_row(job):
    total = job.reducing_state("total")
    total.add_many(["a", "b"], [1.0, 2.0], ns="w1")
    total.add_many(["a", "b", "a"], [10.0, 20.0, 30.0], ns=["w1", "w2", "w2"])
    assert total.get_many(["a", "b"]).isna().all()  # the default namespace holds nothing
    assert total.get_many(["a", "b"], ns="w1").tolist() == [11.0, 2.0]
    assert total.get_many(["a", "b", "a"], ns=pd.Series(["w2", "w2", "w1"])).tolist() == [30.0, 20.0, 11.0]
    assert total.get("b", ns="w2") == 20.0


def test_every_input_kind(job):
    total = job.reducing_state("total")
    keys = pd.Series(KEYS[:4], index=[40, 30, 20, 10])
    total.add_many(keys, pd.Series([1.0, 2.0, 3.0, 4.0], index=keys.index))
    total.add_many(np.array(KEYS[:4]), np.ones(4))  # numpy unicode keys
    total.add_many(np.array(KEYS[:4], dtype=object), [1, 1, 1, 1])
    total.add_many(pa.array(KEYS[:4]), pa.array([1.0] * 4))
    total.add_many(pa.chunked_array([KEYS[:2], KEYS[2:4]]), pa.chunked_array([[1.0], [1.0, 1.0, 1.0]]))
    total.add_many(pd.Series(KEYS[:4], dtype="category"), (1.0 for _ in range(4)))
    expected = [6.0, 7.0, 8.0, 9.0]
    by_series = total.get_many(keys)
    assert by_series.index.tolist() == [40, 30, 20, 10] and by_series.tolist() == expected
    assert isinstance(total.get_many(pd.Index(KEYS[:4])).index, pd.RangeIndex)
    arrow = total.get_many(tuple(KEYS[:4]), as_arrow=True)
    assert arrow.type == pa.float64() and arrow.to_pylist() == expected
    score, level = job.value_state("score"), job.value_state("level")
    score.put_many(np.array([2**40, -5, 7], dtype=np.int64), [1, 2, 3])
    score.put_many(pd.Series([8], dtype="int8"), pd.Series([4], dtype="int32"))
    assert score.get_many([-5, 2**40, 8, 9]).tolist() == [2, 1, 4, pd.NA]
    assert score.value(2**40) == 1
    level.put_many(np.arange(100, dtype=np.int32), np.linspace(0, 1, 100))
    got = level.get_many(pa.array([99, 0, 1000], pa.int64()))
    assert got.dtype == np.float64 and got.tolist()[:2] == [1.0, 0.0] and np.isnan(got.iloc[2])
    assert job.columns().get("level", [], as_arrow=True).to_pylist() == []
    assert job.columns().put("level", np.array([], np.int32), []) == 0


# -- errors ---------------------------------------------------------------------------------------


def test_errors_are_the_clients_exceptions(job):
    total, score, level = job.reducing_state("total"), job.value_state("score"), job.value_state("level")
    with pytest.raises(InvalidRequest, match="string keys; got int64"):
        total.add_many([1, 2], [1.0, 2.0])
    with pytest.raises(InvalidRequest, match="row 2: key is null"):
        total.add_many(["a", "b", None], [1.0, 2.0, 3.0])
    with pytest.raises(InvalidRequest, match="row 1: key is null"):
        score.put_many(pd.Series([1, None], dtype="Int64"), [1, 2])
    with pytest.raises(InvalidRequest, match="long keys; got double"):
        score.put_many(np.array([1.5]), [1])
    with pytest.raises(InvalidRequest, match="outside the 32-bit range"):
        level.put_many([2**40], [1.0])
    with pytest.raises(InvalidRequest, match="2 keys but 3 values"):
        total.add_many(["a", "b"], [1.0, 2.0, 3.0])
    with pytest.raises(InvalidRequest, match="keys must be a column"):
        total.get_many("abc")
    with pytest.raises(NotFound) as missing:
        job.columns().get("no_such_state", ["a"])
    assert missing.value.code == "state_not_found"
    with pytest.raises(Conflict) as wrong:
        job.columns().add("last", ["a"], [1])
    assert wrong.value.code == "wrong_state_kind"
    with pytest.raises(InvalidRequest) as typed:
        total.add_many(["a"], ["not a number"])
    assert typed.value.status == 422
    total.add_many(["a"], [1.0])
    assert total.get("a") == 1.0  # the refused requests wrote nothing


def test_a_bad_row_is_named_by_its_position_in_the_callers_rows(job):
    items = job.list_state("items")
    values = [["x"]] * len(KEYS)
    values[137] = None  # a list state's put needs a list in every row
    with pytest.raises(InvalidRequest) as bad:
        items.put_many(KEYS, values)
    assert bad.value.detail.startswith("row 137:"), bad.value.detail
    assert bad.value.problem["row"] == 137


# -- chunking above the row limit ------------------------------------------------------------


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    """One replica whose requests take at most 50 rows."""
    server = start_server(tmp_path_factory.mktemp("small-batches"), {"STATEHOUSE_MAX_BATCH_OPS": "50"})
    yield server
    server.stop()


def test_inputs_above_the_row_limit_go_in_chunks(small_server, job_name, monkeypatch):
    with StatehouseClient([small_server.url], max_columnar_rows=50) as client:
        job = client.create_job(job_name)
        total = job.register("total", "reducing", function="sum", value_type="float64")
        counting = CountingTransport(job, monkeypatch)
        keys = [f"k{i % 300}" for i in range(1000)]
        total.add_many(keys, 1.0)
        assert [rows for _op, rows, _p in counting.requests[0]] == [50] * 20
        got = total.get_many([f"k{i}" for i in reversed(range(301))])
        assert np.isnan(got.iloc[0]) and got.iloc[1:].tolist() == [
            4.0 if i < 100 else 3.0 for i in reversed(range(300))
        ]
        with pytest.raises(InvalidRequest) as too_many:
            job.columns(max_rows=51).get("total", keys)
        assert too_many.value.code == "batch_too_large"
        job.register("events", "reducing", function="sum", value_type="int64")
        counting.requests[0].clear()
        # Two states: each row is two writes, and the server's limit counts writes.
        assert job.columns().add_states({"total": 1.0, "events": 1}, keys[:100]) == 200
        assert [rows for _op, rows, _p in counting.requests[0]] == [25] * 4


def test_big_rows_go_in_chunks_of_at_most_the_request_bytes(job, monkeypatch):
    monkeypatch.setattr(arrow_module, "MAX_REQUEST_BYTES", 10_000)
    counting = CountingTransport(job, monkeypatch)
    blobs = job.columns()
    big = pa.array([b"x" * 1_000] * 40, pa.binary())
    blobs.put("last", KEYS[:40], big)  # 40 rows of ~1 kB: at most 10 per request
    assert sum(rows for requests in counting.requests for _op, rows, _p in requests) == 40
    assert max(rows for requests in counting.requests for _op, rows, _p in requests) <= 10
    counting.requests[:] = [[] for _ in counting.requests]
    whole = pa.array([b"y" * 1_000] * 5_000, pa.binary())  # 5 MB of buffers ...
    blobs.put("last", KEYS[:3], whole.slice(10, 3))  # ... of which a 3-row slice goes at once
    assert all(len(requests) <= 1 for requests in counting.requests)  # one request per replica
    assert sum(rows for requests in counting.requests for _op, rows, _p in requests) == 3
    assert blobs.get("last", KEYS[:4], as_arrow=True).to_pylist() == [b"y" * 1_000] * 3 + [b"x" * 1_000]


def test_chunks_on_two_replicas_stay_in_order_per_replica(job, monkeypatch):
    counting = CountingTransport(job, monkeypatch)
    items = job.columns(max_rows=7)
    rows = [(k, f"{k}:{n}") for n in range(3) for k in KEYS[:20]]
    items.add("items", [k for k, _ in rows], [v for _, v in rows])
    assert all(rows <= 7 for requests in counting.requests for _op, rows, _p in requests)
    assert sum(len(r) for r in counting.requests) > 2
    assert items.get("items", KEYS[:3]).tolist() == [[f"{k}:{n}" for n in range(3)] for k in KEYS[:3]]


def test_only_requests_safe_to_repeat_are_retried(job, monkeypatch):
    """The batch endpoint's rule: reads, and writes whose repetition changes nothing (put,
    clear, map_put, map_remove), may be re-sent after a timeout; add and map_add only under a
    task attempt, whose seq makes the server answer a re-sent request without applying it."""
    counting = CountingTransport(job, monkeypatch)
    plain = job.columns()
    plain.put("last", ["a"], [1])
    plain.clear("last", ["a"])
    plain.get("last", ["a"])
    plain.add("total", ["a"], [1.0])
    plain.map_put("tags", ["a"], ["x"], [1])
    plain.map_add("tags", ["a"], ["x"], [1])
    plain.map_get("tags", ["a"], ["x"])
    plain.map_remove("tags", ["a"], ["x"])
    plan = MicroBatchCoordinator(job).begin(0)
    job.columns(TaskAttempt(plan.epoch, 0, len(job.replicas))).add("total", ["a"], [1.0])
    assert counting.idempotent == [
        ("put", True),
        ("clear", True),
        ("get", True),
        ("add", False),
        ("map_put", True),
        ("map_add", False),
        ("map_get", True),
        ("map_remove", True),
        ("add", True),
    ]


# -- task attempts -----------------------------------------------------------------------------


def test_a_task_attempts_columnar_writes_are_staged_counted_in_rows_and_applied_once(job):
    coordinator = MicroBatchCoordinator(job)
    plan = coordinator.begin(0)
    attempt = TaskAttempt(plan.epoch, 0, len(job.replicas), unit="u", task=1)
    cols = job.columns(attempt)
    keys = KEYS + KEYS[:10]  # duplicate keys: every row is a write
    assert cols.add("total", keys, 1.0) == len(keys)
    assert job.reducing_state("total").get_many(KEYS[:3]).isna().all()  # invisible to others
    other = job.columns(TaskAttempt(plan.epoch, 1, len(job.replicas), unit="u", task=2))
    assert other.get("total", KEYS[:3]).isna().all()
    assert cols.get("total", KEYS[:12]).tolist() == [2.0] * 10 + [1.0] * 2  # read-your-writes
    assert attempt.message().ops == tuple(routed(job, "total", keys))

    # A request re-sent with its seq (the answer was lost) is answered again, applied once.
    replica = 0
    mine = [k for k in KEYS if job.replica_for("total", k) == replica][:5]
    body = ipc_stream(pa.table({"key": mine, "value": [100.0] * len(mine)}))
    fields = attempt.fields(replica)
    first = job.replicas[replica].columns(job.name, "total", "add", body, params=fields, idempotent=True)
    again = job.replicas[replica].columns(job.name, "total", "add", body, params=fields, idempotent=True)
    assert json.loads(first) == json.loads(again) == {"op": "add", "rows": len(mine), "staged": True}
    attempt.answered(replica, len(mine))

    coordinator.commit(plan, [attempt.message()])
    total = job.reducing_state("total")
    assert total.get_many(mine).tolist() == [(2.0 if KEYS.index(k) < 10 else 1.0) + 100.0 for k in mine]
    rest = [k for k in KEYS if k not in mine]
    assert total.get_many(rest).tolist() == [2.0 if KEYS.index(k) < 10 else 1.0 for k in rest]


def test_add_get_answers_running_results_and_stages_one_write_per_row(job):
    """On two replicas, answered in the caller's order; under a task attempt each row is one
    staged write (the commit's count) and the answers include the attempt's own earlier adds."""
    total = job.columns()
    assert total.add_get("total", KEYS[:3], 1.0).tolist() == [1.0, 1.0, 1.0]
    coordinator = MicroBatchCoordinator(job)
    plan = coordinator.begin(0)
    attempt = TaskAttempt(plan.epoch, 0, len(job.replicas), unit="u", task=1)
    cols = job.columns(attempt)
    keys = [*KEYS[:50], *KEYS[:2]]
    answered = cols.add_get("total", keys, 2.0)
    assert answered.tolist() == [3.0, 3.0, 3.0] + [2.0] * 47 + [5.0, 5.0]
    assert cols.add_get("mean", ["m", "m"], [1.0, 2.0]).tolist() == [1.0, 1.5]
    assert attempt.message().ops == tuple(
        a + b for a, b in zip(routed(job, "total", keys), routed(job, "mean", ["m", "m"]), strict=True)
    )
    assert job.reducing_state("total").get_many(KEYS[:1]).tolist() == [1.0]  # staged: not committed yet
    coordinator.commit(plan, [attempt.message()])
    final = [5.0, 5.0, 3.0] + [2.0] * 47  # each key's last answer is what the commit wrote
    assert job.reducing_state("total").get_many(KEYS[:50]).tolist() == final
    with pytest.raises(Conflict):
        job.columns().add_get("items", ["k"], "x")  # a list: wrong_state_kind


def test_several_states_go_in_one_request_per_replica(job, monkeypatch):
    """``add_states``, ``add_get_states`` and ``get_states``: one request per replica carries
    every state's column for the same keys (rows routed once, answered in the caller's order);
    under a task attempt every row of every state is one staged write."""
    sent: list[tuple[object, str]] = []
    for replica in job.replicas:
        real = replica.columns

        def counting(name, state, op, body, *, _real=real, **kwargs):
            sent.append((state, op))
            return _real(name, state, op, body, **kwargs)

        monkeypatch.setattr(replica, "columns", counting)
    cols = job.columns()
    keys = pd.Series(KEYS[:100], index=range(500, 600))
    assert cols.add_states({"total": np.arange(100, dtype=np.float64), "mean": 2.0}, keys) == 200
    assert sent == [(("total", "mean"), "add")] * 2  # two replicas, one request each
    read = cols.get_states(["mean", "total"], keys)
    assert list(read.columns) == ["mean", "total"] and read.index.equals(keys.index)
    assert read["total"].tolist() == [float(i) for i in range(100)] and read["mean"].tolist() == [2.0] * 100

    coordinator = MicroBatchCoordinator(job)
    plan = coordinator.begin(0)
    attempt = TaskAttempt(plan.epoch, 0, len(job.replicas), unit="u", task=1)
    staged = job.columns(attempt)
    answered = staged.add_get_states({"total": 1.0, "mean": 4.0}, KEYS[:3], as_arrow=True)
    assert answered["total"].to_pylist() == [1.0, 2.0, 3.0] and answered["mean"].to_pylist() == [3.0] * 3
    assert sum(attempt.message().ops) == 6
    coordinator.commit(plan, [attempt.message()])
    assert job.columns().get_states(["total"], KEYS[:2])["total"].tolist() == [1.0, 2.0]
    with pytest.raises(InvalidRequest, match="key types"):
        cols.get_states(["total", "score"], [1])
    with pytest.raises(NotFound):
        cols.get_states(["total", "nope"], KEYS[:1])


def test_a_replay_reads_and_refuses_to_write(job):
    config = ClientConfig.of([r.url for r in job.replicas])
    replay = BatchContext(config, job.name, 0, None, True)
    cols = replay.columns(job)
    job.reducing_state("total").add_many(["a"], [1.0])
    assert cols.get("total", ["a"]).tolist() == [1.0]
    with pytest.raises(RuntimeError, match="replay must not write"):
        cols.add("total", ["a"], [1.0])
    outside = BatchContext(config, job.name, 0, 3, False)  # on the driver: no task attempt
    with pytest.raises(RuntimeError, match="inside a task"):
        outside.columns(job).put("last", ["a"], [1])
    assert isinstance(outside.columns(job), Columns)


# -- Spark: mapInPandas and mapInArrow under exactly_once ---------------------------------------


@pytest.mark.spark
def test_map_in_pandas_and_map_in_arrow_update_state_exactly_once(spark, client, job):
    config = ClientConfig.of([r.url for r in job.replicas])
    events = [(f"user-{i % 30}", float(i)) for i in range(300)]
    expected: dict[str, float] = {}
    for user, amount in events:
        expected[user] = expected.get(user, 0.0) + amount

    def update_pandas(batch, cols, ctx):
        if not ctx.replay:
            cols.add("total", batch["user_id"], batch["amount"])
        return pd.DataFrame({"user_id": batch["user_id"], "total": cols.get("total", batch["user_id"])})

    def update_arrow(batch, cols, ctx):
        if not ctx.replay:
            cols.add("total", batch.column("user_id"), batch.column("amount"))
        totals = cols.get("total", batch.column("user_id"), as_arrow=True)
        return pa.RecordBatch.from_arrays([batch.column("user_id"), totals], names=["user_id", "total"])

    outputs = {}

    def process(df, ctx):
        helper, fn = (with_state_pandas, update_pandas) if ctx.batch_id % 2 == 0 else (with_state_arrow, update_arrow)
        mapped = df.mapInPandas if helper is with_state_pandas else df.mapInArrow
        rows = mapped(helper(ctx, fn), "user_id string, total double").collect()
        outputs[ctx.batch_id] = {r.user_id: r.total for r in rows}

    df = spark.createDataFrame(events, "user_id string, amount double").repartition(3, "user_id")
    run = exactly_once(config, job.name, process)
    run(df, 0)  # mapInPandas
    state = job.reducing_state("total")
    assert dict(zip(expected, state.get_many(list(expected)).tolist(), strict=True)) == expected
    assert outputs[0] == expected  # each task read its own staged writes (a user's rows are in one partition)
    run(df, 1)  # mapInArrow
    assert state.get_many(list(expected)).tolist() == [2 * v for v in expected.values()]
    run(df, 1)  # a replay: reads only, nothing applied twice
    assert state.get_many(list(expected)).tolist() == [2 * v for v in expected.values()]
    assert outputs[1] == {k: 2 * v for k, v in expected.items()}
