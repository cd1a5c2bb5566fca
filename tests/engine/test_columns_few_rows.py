"""A columnar request of a few rows is located row by row (``KeySpace.locate_column`` below
``keyspace.FEW_ROWS``), a bigger one as whole columns: one engine either way. The same requests,
run once with every request on the whole-column path and once with every request on the row path,
give the same answers (byte for byte, as Arrow IPC), the same refusals (code, message, row) and
the same stored bytes, on both backends."""

import random

import pyarrow as pa

from statehouse.backends import keyspace
from statehouse.backends.attempts import perform
from statehouse.backends.columns import ColumnOp
from statehouse.backends.errors import StateError
from statehouse.backends.limits import Limits
from statehouse.snapshots.stored.descriptors import StateDescriptor
from tests.support.arrow_ipc import stream

STATES = (
    StateDescriptor("v", "value"),
    StateDescriptor("t", "value", value_type="string"),
    StateDescriptor("n", "value", key_type="int", value_type="int64"),
    StateDescriptor("g", "reducing", key_type="long", function="sum", value_type="int64"),
    StateDescriptor("l", "list"),
    StateDescriptor("m", "map"),
)
MAX_KEY_BYTES = 64


def _invalid_utf8() -> pa.Array:
    """A utf8 array whose one value is not UTF-8 (what an IPC reader lets through)."""
    data = b"\xff\xfe"
    return pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(b"\0\0\0\0\2\0\0\0"), pa.py_buffer(data)])


def _requests(owned) -> list[tuple[str, str, pa.Table]]:
    """Requests of 0 to 16 rows over every key type, namespaces, duplicates and non-ASCII keys
    (supplementary-plane ones too), and ones each path must refuse the same way."""
    rnd = random.Random(32)
    words = ["", "a", "user-1", "üser", "ключ", "鍵", "😀x", "a😀b", "x" * 40, "tab\tkey"]
    strings = [w for w in words if owned(w, "string")]
    ints = [i for i in (0, 1, -1, 7, 2**31 - 1, -(2**31), 123_456) if owned(i, "int")]
    longs = [i for i in (0, 1, -1, 2**40, 2**63 - 1, -(2**63), 9_876_543_210) if owned(i, "long")]
    foreign = next(w for w in (f"f{i}" for i in range(100)) if not owned(w, "string"))
    requests: list[tuple[str, str, pa.Table]] = []
    for _ in range(30):
        rows = rnd.choice((0, 1, 1, 2, 3, 5, 16))
        keys = [rnd.choice(strings) for _ in range(rows)]
        spaces = [rnd.choice(["", "ns1", "名前"]) for _ in range(rows)]
        values = [rnd.choice([b"x", b"", None, b"\x00" * 9]) for _ in range(rows)]
        requests.append(("v", "put", pa.table({"key": keys, "value": pa.array(values, pa.binary())})))
        requests.append(("v", "get", pa.table({"key": keys})))
        text = pa.array([rnd.choice(["a", "ü", None]) for _ in range(rows)], pa.large_string())
        requests.append(("t", "put", pa.table({"key": pa.array(keys, pa.large_string()), "ns": spaces, "value": text})))
        requests.append(("t", "get", pa.table({"key": keys, "ns": spaces})))
        numbers = [rnd.choice(ints) for _ in range(rows)]
        requests.append(("n", "put", pa.table({"key": pa.array(numbers, pa.int64()), "value": list(range(rows))})))
        requests.append(("n", "get", pa.table({"key": pa.array(numbers, pa.int32())})))
        big = [rnd.choice(longs) for _ in range(rows)]
        requests.append(("g", "add_get", pa.table({"key": pa.array(big, pa.int64()), "value": [1] * rows})))
        requests.append(("l", "add", pa.table({"key": keys, "ns": spaces, "value": [str(i) for i in range(rows)]})))
        requests.append(("l", "get", pa.table({"key": keys, "ns": spaces})))
        user_keys = [rnd.choice(["u", "ü", ""]) for _ in range(rows)]
        requests.append(("m", "map_put", pa.table({"key": keys, "user_key": user_keys, "value": list(range(rows))})))
        requests.append(("m", "get", pa.table({"key": keys})))
        requests.append(("v", "clear", pa.table({"key": keys[: rows // 2]})))
    good = strings[0]
    refused = [
        pa.table({"key": pa.array([good, None])}),  # a null key
        pa.table({"key": pa.array([1, 2])}),  # integers for string keys
        pa.table({"key": [good, "k" * MAX_KEY_BYTES]}),  # a key over the limit
        pa.table({"key": [good, foreign]}),  # another replica's key
        pa.table({"key": [good], "ns": ["n" * MAX_KEY_BYTES]}),  # a namespace over the limit
        pa.table({"key": pa.concat_arrays([pa.array([good]), _invalid_utf8()])}),  # not UTF-8
        pa.table({"key": pa.array([good, good]).dictionary_encode()}),  # a dictionary: decoded
        pa.table({"key": pa.array([good], pa.string_view())}),
    ]
    requests += [("v", "get", table) for table in refused]
    requests.append(("n", "get", pa.table({"key": pa.array([ints[0], 2**31], pa.int64())})))  # out of int range
    requests.append(("g", "add", pa.table({"key": pa.array([2**63], pa.uint64()), "value": [1]})))
    requests.append(("n", "get", pa.table({"key": pa.array([ints[0], None], pa.int32())})))
    return requests


def _run(job, requests, few_rows: int, monkeypatch) -> list:
    """Every request's answer (IPC bytes), ``None`` (a write) or refusal, with ``FEW_ROWS`` set."""
    monkeypatch.setattr(keyspace, "FEW_ROWS", few_rows)
    outcomes = []
    for state, op, table in requests:
        work = ColumnOp.parse(state, op, table)
        try:
            values = perform(job, work)
        except StateError as exc:
            outcomes.append((type(exc).__name__, exc.code, str(exc), exc.extra))
            continue
        outcomes.append(None if values is None else stream(work.answer(values)))
    return outcomes


def _stored(job) -> dict:
    """Every stored row of every table, as bytes."""
    with job.partition.freeze() as view:
        return {
            table: [row for kg in range(job.keyspace.max_parallelism) for row in view.scan(table, kg)]
            for table in view.tables()
        }


def test_few_rows_and_whole_columns_answer_and_store_the_same(make_catalog, tmp_path, monkeypatch):
    jobs = []
    for name in ("columns", "rows"):  # replica 0 of 2: half the key groups are another's
        catalog = make_catalog(replica_index=0, replica_count=2, data_dir=tmp_path / name)
        catalog.limits = Limits(max_key_bytes=MAX_KEY_BYTES)
        job, _ = catalog.create("job1", 128)
        for descriptor in STATES:
            job.register_state(descriptor)
        jobs.append(job)
    space = jobs[0].keyspace
    assert jobs[0].limits.max_key_bytes == MAX_KEY_BYTES
    requests = _requests(lambda key, key_type: space.key_group(key, key_type) in space.owned)
    whole = _run(jobs[0], requests, 0, monkeypatch)
    few = _run(jobs[1], requests, 1 << 30, monkeypatch)
    for (state, op, table), expected, got in zip(requests, whole, few, strict=True):
        assert got == expected, (state, op, table.to_pydict())
    refusals = [outcome for outcome in whole if isinstance(outcome, tuple)]
    assert {r[1] for r in refusals} >= {"invalid_key", "key_too_large", "key_not_owned"}
    assert sum(isinstance(outcome, bytes) for outcome in whole) > 100
    assert _stored(jobs[0]) == _stored(jobs[1])
