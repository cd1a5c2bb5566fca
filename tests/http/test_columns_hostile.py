"""Hostile but plausible Arrow IPC bodies on the columnar endpoint, over real HTTP: every one is
a clear 4xx problem+json that writes nothing (or, where the input is in fact fine, the same
state the plain columns would write), no body makes the replica allocate much more than the
body, and /healthz keeps answering.

Each attack that once got through (a 500, an allocation of hundreds of MB, rows dropped or a
state poisoned) is kept here as the regression test of its fix.
"""

from __future__ import annotations

import decimal
import math
import struct
import threading
import time
from contextlib import contextmanager

import httpx
import numpy as np
import pyarrow as pa
import pytest

from tests.support.arrow_ipc import ARROW, arrow, post, stream
from tests.support.problems import problem
from tests.support.process_memory import MB, peak_growth

pytestmark = [pytest.mark.http]

INT64_MAX = 2**63 - 1


# -- bodies ----------------------------------------------------------------------------------


def batches(schema: pa.Schema, parts: list[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for part in parts:
            writer.write_batch(part)
    return sink.getvalue().to_pybytes()


def one_list(child: pa.Array) -> pa.Array:
    """One row: a list of every element of ``child``."""
    return pa.ListArray.from_arrays(pa.array([0, len(child)], pa.int32()), child)


def zero_width(kind: pa.DataType, length: int) -> pa.Array:
    """``length`` elements of a fixed-size type zero bytes wide (no data at all)."""
    if pa.types.is_fixed_size_list(kind):
        return pa.Array.from_buffers(kind, length, [None], children=[pa.array([], kind.value_type)])
    return pa.Array.from_buffers(kind, length, [None, pa.py_buffer(b"")])


def bad_dictionary(index: int, entries: pa.Array) -> pa.Array:
    """A dictionary column whose one index points outside its dictionary."""
    return pa.DictionaryArray.from_arrays(pa.array([index], pa.int8()), entries, safe=False)


def invalid_utf8() -> pa.Array:
    return pa.Array.from_buffers(
        pa.string(), 1, [None, pa.py_buffer(struct.pack("<ii", 0, 2)), pa.py_buffer(b"\xff\xfe")]
    )


def views_of(text: bytes, rows: int) -> pa.Array:
    """A string_view column whose every row views the same ``text`` (one copy on the wire)."""
    view = np.array([len(text), int.from_bytes(text[:4], "little", signed=True), 0, 0], np.int32)
    return pa.Array.from_buffers(pa.string_view(), rows, [None, pa.py_buffer(np.tile(view, rows)), pa.py_buffer(text)])


# The IPC framing and the few FlatBuffers fields (format/Message.fbs) needed to forge messages
# that pyarrow's writer would never produce.


def _field(data: bytes, table: int, slot: int) -> int:
    vtable = table - struct.unpack_from("<i", data, table)[0]
    entry = 4 + 2 * slot
    if entry + 2 > struct.unpack_from("<H", data, vtable)[0]:
        return 0
    offset = struct.unpack_from("<H", data, vtable + entry)[0]
    return table + offset if offset else 0


def _record_batches(raw: bytes):
    """(metadata start, metadata bytes, RecordBatch table) of every record batch message."""
    pos = 0
    while pos + 8 <= len(raw):
        length = struct.unpack_from("<i", raw, pos + 4)[0]
        if length <= 0:
            return
        meta = raw[pos + 8 : pos + 8 + length]
        message = struct.unpack_from("<I", meta, 0)[0]
        body_field = _field(meta, message, 3)
        body = struct.unpack_from("<q", meta, body_field)[0] if body_field else 0
        kind, header = _field(meta, message, 1), _field(meta, message, 2)
        if kind and header and meta[kind] == 3:
            yield pos + 8, meta, header + struct.unpack_from("<I", meta, header)[0]
        pos += 8 + length + body


def forge_lengths(raw: bytes, length: int, batch: bool = True, nodes: tuple[int, ...] | None = None) -> bytes:
    """Every record batch's ``length`` (if ``batch``) and the field nodes' lengths (all, or the
    ``nodes`` listed) set to ``length``; the buffers stay as they are."""
    out = bytearray(raw)
    for start, meta, table in _record_batches(raw):
        if batch:
            struct.pack_into("<q", out, start + _field(meta, table, 0), length)
        vector = _field(meta, table, 1)
        vector += struct.unpack_from("<I", meta, vector)[0]
        for i in range(struct.unpack_from("<I", meta, vector)[0]):
            if nodes is None or i in nodes:
                struct.pack_into("<q", out, start + vector + 4 + 16 * i, length)
    return bytes(out)


def compression_only_in_custom_metadata(table: pa.Table, codec: str) -> bytes:
    """zstd/lz4 buffers whose RecordBatch has no ``compression`` field: only the message's custom
    metadata ``ARROW:experimental_compression`` (Arrow 0.17's way) names the codec."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=codec)) as writer:
        for part in table.to_batches():
            writer.write_batch(part, custom_metadata={"ARROW:experimental_compression": codec})
    raw = sink.getvalue().to_pybytes()
    out = bytearray(raw)
    for start, meta, table_at in _record_batches(raw):
        vtable = table_at - struct.unpack_from("<i", meta, table_at)[0]
        struct.pack_into("<H", out, start + vtable + 4 + 2 * 3, 0)  # RecordBatch.compression: absent
    return bytes(out)


# -- requests --------------------------------------------------------------------------------


def stored(http, job, state, key, ns=None):
    """A key's value through the per-operation API (``None`` when absent)."""
    r = http.get(f"{job}/states/{state}/keys/{key}", params={"ns": ns} if ns is not None else None)
    if r.status_code == 404:
        assert r.json()["code"] == "key_not_found", r.text
        return None
    assert r.status_code == 200, r.text
    return r.json()["value"]


def read_values(response) -> list:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == ARROW
    return pa.ipc.open_stream(response.content).read_all().column("value").to_pylist()


def healthy(server) -> bool:
    return httpx.get(server.url + "/healthz", timeout=5).status_code == 200


# -- the replica's memory and its event loop ---------------------------------------------------


@contextmanager
def health_probe(server):
    """Polls /healthz while the block runs; yields a dict counting the polls that failed."""
    done, result = threading.Event(), {"failures": 0}

    def poll():
        with httpx.Client(timeout=30) as client:
            while not done.is_set():
                try:
                    client.get(server.url + "/healthz").raise_for_status()
                except httpx.HTTPError:
                    result["failures"] += 1
                done.wait(0.02)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    time.sleep(0.05)
    try:
        yield result
    finally:
        done.set()
        thread.join(60)


# -- the job -----------------------------------------------------------------------------------

STATES = {
    "seen": {"kind": "value"},
    "blob": {"kind": "value", "value_type": "binary"},
    "items": {"kind": "list"},
    "words": {"kind": "list", "value_type": "string"},
    "total": {"kind": "reducing", "function": "sum", "value_type": "float64"},
    "anysum": {"kind": "reducing", "function": "sum"},
    "isum": {"kind": "reducing", "function": "sum", "value_type": "int64"},
    "tags": {"kind": "map", "function": "sum", "value_type": "int64"},
    "props": {"kind": "map"},
    "by_int": {"kind": "value", "key_type": "int"},
    "by_id": {"kind": "value", "key_type": "long"},
}


def make_job(client: httpx.Client, name: str) -> str:
    client.put(f"/jobs/{name}", json={"max_parallelism": 128}).raise_for_status()
    for state, body in STATES.items():
        client.put(f"/jobs/{name}/states/{state}", json=body).raise_for_status()
    return f"/jobs/{name}"


@pytest.fixture
def job(http, job_name):
    return make_job(http, job_name)


# -- compression and repetition: small bodies that would decode to a lot -----------------------


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_compression_bomb_is_refused_before_it_inflates(http, job, server, codec):
    """128 MB of zeros compresses to a few KB (zstd) or ~0.5 MB (lz4); inflated, it used to cost
    the replica ~5x that (2.5 GB peak for 500 MB, measured before arrow_body.py)."""
    zeros = pa.py_buffer(bytes(128 * MB))  # calloc'd, not copied: the test itself stays small
    value = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(struct.pack("<ii", 0, zeros.size)), zeros])
    body = stream(pa.table({"key": ["a"], "value": value}), compression=codec)
    assert len(body) < 1 * MB
    with peak_growth(server.process.pid) as grown:
        r = post(http, job, "blob", "put", body)
    assert "uncompressed" in problem(r, 415, "unsupported_media_type")["detail"]
    assert grown["peak"] < 64 * MB, grown
    assert stored(http, job, "blob", "a") is None
    assert healthy(server)


def test_compression_named_only_in_custom_metadata_is_not_inflated(http, job):
    """Arrow 0.17 named the codec in the message's custom metadata; pyarrow 26 no longer inflates
    such buffers, so they are garbage, refused as such (not decoded, not a 500)."""
    body = compression_only_in_custom_metadata(pa.table({"key": ["a"], "value": pa.array([bytes(MB)])}), "zstd")
    problem(post(http, job, "blob", "put", body), 400, "malformed_body")
    assert stored(http, job, "blob", "a") is None


def repeated(text: str, rows: int) -> pa.Array:
    """A dictionary column: ``text`` once on the wire, in every one of ``rows`` rows."""
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), [text])


ROWS = [f"k{i}" for i in range(10_000)]
REPEATED = {
    "list-of-nulls": ("value", "seen", "get", {"key": ["a"], "value": one_list(pa.nulls(10**8))}),
    "list-of-empty-structs": (
        "value",
        "seen",
        "get",
        {"key": ["a"], "value": one_list(pa.Array.from_buffers(pa.struct([]), 10**8, [None]))},
    ),
    "dictionary-value": ("value", "seen", "put", {"key": ROWS, "value": repeated("x" * 8_000, 10_000)}),
    "dictionary-ns": ("ns", "seen", "put", {"key": ROWS, "value": [1] * 10_000, "ns": repeated("n" * 8_000, 10_000)}),
    "string-view-key": ("key", "seen", "get", {"key": views_of(b"k" * 8_000, 10_000)}),
    "dictionary-user-key": (
        "user_key",
        "tags",
        "map_put",
        {"key": ROWS, "value": [1] * 10_000, "user_key": repeated("u" * 8_000, 10_000)},
    ),
}


@pytest.mark.parametrize(("column", "state", "op", "columns"), REPEATED.values(), ids=REPEATED.keys())
def test_repeated_data_past_the_body_limit_is_refused_undecoded(http, job, server, column, state, op, columns):
    """~80 MB or more decoded from at most a few MB on the wire (STATEHOUSE_MAX_BODY_BYTES: 64 MiB)."""
    body = arrow(**columns)
    assert len(body) < 16 * MB
    with peak_growth(server.process.pid) as grown:
        r = post(http, job, state, op, body)
    assert f"column {column!r} decodes to" in problem(r, 413, "body_too_large")["detail"]
    assert grown["peak"] < 64 * MB, grown
    assert stored(http, job, state, "a") is None and stored(http, job, state, "k0") is None


def run_ends(value: pa.Array) -> pa.Array:
    return pa.RunEndEncodedArray.from_arrays(pa.array([5], pa.int32()), value)


UNION_CHILDREN = [pa.array([1]), pa.array(["s"])]
UNUSED_ENCODINGS = [
    ("by_int", "get", {"key": run_ends(pa.array([7], pa.int32()))}, "run_end_encoded"),
    ("seen", "put", {"key": ["a"] * 5, "value": run_ends(pa.array(["x"]))}, "run_end_encoded"),
    ("words", "put", {"key": ["a"], "value": pa.array([["x"]], pa.list_view(pa.string()))}, "list_view"),
    (
        "seen",
        "put",
        {"key": ["a"], "value": pa.UnionArray.from_sparse(pa.array([1], pa.int8()), UNION_CHILDREN)},
        "sparse_union",
    ),
    (
        "seen",
        "put",
        {
            "key": ["a"],
            "value": pa.UnionArray.from_dense(pa.array([0], pa.int8()), pa.array([0], pa.int32()), UNION_CHILDREN),
        },
        "dense_union",
    ),
]


@pytest.mark.parametrize(("state", "op", "columns", "kind"), UNUSED_ENCODINGS)
def test_encodings_the_engine_has_no_use_for_are_refused(http, job, state, op, columns, kind):
    assert kind in problem(post(http, job, state, op, arrow(**columns)), 422, "invalid_argument")["detail"]
    assert stored(http, job, state, "7" if state == "by_int" else "a") is None


@pytest.mark.parametrize("kind", [pa.binary(0), pa.list_(pa.int8(), 0)], ids=["fixed_size_binary(0)", "empty-fsl"])
def test_zero_width_elements_are_counted_like_nulls(http, job, kind):
    # 80M elements decode past STATEHOUSE_MAX_BODY_BYTES (64 MiB) as 80M nulls do. A `get` does not
    # take a value column, so the unfixed server refuses it for that (422) without decoding anything.
    r = post(http, job, "seen", "get", arrow(key=["a"], value=one_list(zero_width(kind, 80_000_000))))
    assert "column 'value' decodes to" in problem(r, 413, "body_too_large")["detail"]


def test_a_list_of_empty_structs_does_not_balloon(fresh_server):
    with httpx.Client(base_url=fresh_server.url + "/v1", timeout=60) as client:
        job = make_job(client, "bomb")
        body = arrow(key=["a"], value=one_list(pa.Array.from_buffers(pa.struct([]), 5_000_000, [None])))
        assert len(body) < 1024
        with peak_growth(fresh_server.process.pid) as grown:
            r = post(client, job, "seen", "put", body)
        assert 400 <= r.status_code < 500, r.text
        assert stored(client, job, "seen", "a") is None
        assert grown["peak"] < 128 * MB, grown


def test_a_long_key_is_refused_without_keeping_memory(fresh_server):
    with httpx.Client(base_url=fresh_server.url + "/v1", timeout=60) as client:
        job = make_job(client, "longkey")
        with peak_growth(fresh_server.process.pid) as grown:
            r = post(client, job, "seen", "get", arrow(key=["k" * (4 * MB)]))
        problem(r, 413, "key_too_large")
        assert grown["kept"] < 48 * MB, grown


def test_long_namespaces_user_keys_and_values_are_refused(http, job):
    problem(post(http, job, "seen", "put", arrow(key=["a"], value=[1], ns=["n" * 5000])), 413, "key_too_large")
    problem(
        post(http, job, "tags", "map_put", arrow(key=["a"], user_key=["u" * 5000], value=[1])), 413, "key_too_large"
    )
    problem(post(http, job, "seen", "put", arrow(key=["a"], value=["x" * (MB + 10)])), 413, "value_too_large")
    assert stored(http, job, "seen", "a") is None and stored(http, job, "tags", "a") is None


# -- the stream's structure ----------------------------------------------------------------------


def test_a_schema_without_batches_is_zero_rows(http, job):
    empty = batches(pa.schema([("key", pa.string())]), [])
    assert read_values(post(http, job, "seen", "get", empty)) == []
    r = post(http, job, "seen", "put", batches(pa.schema([("key", pa.string()), ("value", pa.int64())]), []))
    assert r.json() == {"op": "put", "rows": 0, "staged": False}


@pytest.mark.parametrize(
    ("op", "table"),
    [
        ("get", pa.table({})),
        ("get", pa.table([pa.array(["a"]), pa.array(["b"])], names=["key", "key"])),
        ("put", pa.table([pa.array(["a"]), pa.array([1]), pa.array([2])], names=["key", "value", "value"])),
        ("put", pa.table({"key": ["a"], "value": [1], "extra": [1]})),
        ("put", pa.table({"key": ["a"], "value": [1], **{f"c{i}": pa.nulls(1) for i in range(10_000)}})),
        ("put", pa.table({"Key": ["a"], "value": [1]})),
    ],
    ids=["no-columns", "key-twice", "value-twice", "extra-column", "10000-columns", "wrong-case"],
)
def test_columns_must_be_exactly_the_operations(http, job, op, table):
    assert "takes the columns" in problem(post(http, job, "seen", op, stream(table)), 422, "invalid_argument")["detail"]
    assert stored(http, job, "seen", "a") is None


def test_dictionary_columns_mean_their_values_across_deltas_and_replacements(http, job):
    schema = pa.schema([("key", pa.dictionary(pa.int8(), pa.string())), ("value", pa.int64())])

    def part(indices, entries, values):
        return pa.record_batch([pa.DictionaryArray.from_arrays(pa.array(indices, pa.int8()), entries), values], schema)

    first = part([0, 1], ["p", "q"], [1, 2])
    sink = pa.BufferOutputStream()  # a delta: the second batch's dictionary extends the first's
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True)) as writer:
        writer.write_batch(first)
        writer.write_batch(part([2, 0], ["p", "q", "r"], [3, 4]))
    assert post(http, job, "seen", "put", sink.getvalue().to_pybytes()).json()["rows"] == 4
    assert [stored(http, job, "seen", k) for k in "pqr"] == [4, 2, 3]
    replaced = batches(schema, [first, part([0, 1], ["s", "t"], [5, 6])])  # a new dictionary
    assert post(http, job, "seen", "put", replaced).json()["rows"] == 4
    assert [stored(http, job, "seen", k) for k in "pqst"] == [1, 2, 5, 6]
    entries = pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int8()), ["n"])
    post(
        http, job, "tags", "map_add", arrow(key=entries, user_key=entries, value=[1, 2], ns=entries)
    ).raise_for_status()
    assert stored(http, job, "tags", "n", ns="n") == {"n": 3}


def dictionary_deltas(batches: int, per_batch: int, *columns: tuple[str, pa.Array]) -> bytes:
    """One-row batches whose ``key`` dictionary grows by ``per_batch`` entries each, sent as deltas
    (a few bytes per batch on the wire; each delta makes pyarrow build the whole dictionary anew)."""
    entries = pa.array([f"key-{i:07d}-" + "x" * 60 for i in range(batches * per_batch)])
    schema = pa.schema([("key", pa.dictionary(pa.int32(), pa.string())), *((n, c.type) for n, c in columns)])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True)) as writer:
        for i in range(batches):
            key = pa.DictionaryArray.from_arrays(pa.array([per_batch * i], pa.int32()), entries[: per_batch * (i + 1)])
            writer.write_batch(pa.record_batch([key, *(c for _, c in columns)], schema))
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("endpoint", ["states/seen/columns/put", "timers/event/columns/register"])
def test_dictionary_deltas_that_would_rebuild_gigabytes_are_refused_undecoded(http, job, server, endpoint):
    """2,000 deltas of 20 entries (3.8 MB): each rebuilt the dictionary so far, 3 GB and 16 s on
    the event loop (heap: 12 GB from 6.8 MB) before arrow_body counted what they build."""
    body = dictionary_deltas(2_000, 20, ("value" if "states" in endpoint else "timestamp", pa.array([1])))
    assert len(body) < 4 * MB
    with health_probe(server) as probe, peak_growth(server.process.pid) as grown:
        r = http.post(f"{job}/{endpoint}", content=body, headers={"content-type": ARROW})
    assert "dictionaries decode to more than" in problem(r, 413, "body_too_large")["detail"]
    assert grown["peak"] < 64 * MB, grown
    assert probe["failures"] == 0, probe
    assert stored(http, job, "seen", "key-0000000-" + "x" * 60) is None
    # A few deltas are fine: what they build fits the limit many times over.
    assert post(http, job, "seen", "put", dictionary_deltas(50, 20, ("value", pa.array([7])))).json()["rows"] == 50
    assert stored(http, job, "seen", "key-0000980-" + "x" * 60) == 7


@pytest.mark.parametrize(
    ("state", "op", "columns"),
    [
        ("seen", "get", {"key": bad_dictionary(5, pa.array(["a"]))}),
        ("seen", "get", {"key": bad_dictionary(-1, pa.array(["a"]))}),
        ("seen", "put", {"key": ["a"], "value": bad_dictionary(7, pa.array(["x"]))}),
        ("seen", "put", {"key": ["a"], "value": [1], "ns": bad_dictionary(7, pa.array(["n"]))}),
        ("tags", "map_put", {"key": ["a"], "user_key": bad_dictionary(7, pa.array(["u"])), "value": [1]}),
        ("blob", "put", {"key": ["a"], "value": bad_dictionary(7, pa.array([b"x"]))}),
    ],
    ids=["key", "key-negative", "value", "ns", "user_key", "binary-value"],
)
def test_a_dictionary_index_out_of_range_is_a_malformed_body(http, job, state, op, columns):
    problem(post(http, job, state, op, arrow(**columns)), 400, "malformed_body")
    assert stored(http, job, state, "a") is None


def test_a_dictionary_index_out_of_range_of_numbers_is_a_malformed_body(http, job):
    key = pa.DictionaryArray.from_arrays(pa.array([7], pa.int8()), pa.array([1], pa.int32()), safe=False)
    problem(post(http, job, "by_int", "put", arrow(key=key, value=[1])), 400, "malformed_body")
    value = pa.DictionaryArray.from_arrays(pa.array([7], pa.int8()), pa.array([1, 2]), safe=False)
    problem(post(http, job, "seen", "put", arrow(key=["a"], value=value)), 400, "malformed_body")
    assert stored(http, job, "seen", "a") is None


def test_cut_and_forged_bodies_are_malformed_and_write_nothing(http, job):
    whole = arrow(key=["a", "b"], value=[1, 2])
    end = len(whole) - 8  # the last 8 bytes: the end-of-stream marker
    for cut in (0, 3, 4, 8, 50, len(whole) // 2, end - 20, end + 4):
        problem(post(http, job, "seen", "put", whole[:cut]), 400, "malformed_body")
    for forged in (
        forge_lengths(whole, 1000),  # rows claimed past the buffers
        forge_lengths(whole, 2**40),
        forge_lengths(whole, -1),
        forge_lengths(whole, 5000, nodes=()),  # the batch's length alone
        forge_lengths(whole, 1, batch=False, nodes=(1,)),  # one column shorter than the batch
        whole[:end] + arrow(key=["c"], value=[3]),  # a second schema where a batch belongs
        b"\xff\xff\xff\xff" + struct.pack("<i", 2**31 - 1) + b"\x00" * 64,  # a 2 GB metadata length
        stream(pa.table({"key": ["a"], "value": [1]}))[:8] + b"\x00" * 200,
    ):
        problem(post(http, job, "seen", "put", forged), 400, "malformed_body")
    file_format = pa.BufferOutputStream()
    with pa.ipc.new_file(file_format, pa.schema([("key", pa.string()), ("value", pa.int64())])) as writer:
        writer.write_table(pa.table({"key": ["a"], "value": [1]}))
    problem(post(http, job, "seen", "put", file_format.getvalue().to_pybytes()), 400, "malformed_body")
    assert stored(http, job, "seen", "a") is None and stored(http, job, "seen", "b") is None
    # Without its end-of-stream marker a stream simply ends: that is Arrow's format, not an error.
    assert post(http, job, "seen", "put", whole[:end]).json()["rows"] == 2


def test_bytes_after_the_end_of_stream_are_refused(http, job):
    body = arrow(key=["a"], value=[1]) + arrow(key=["b"], value=[2])
    problem(post(http, job, "seen", "put", body), 400, "malformed_body")
    assert stored(http, job, "seen", "a") is None


def test_a_bad_later_batch_applies_nothing_of_the_earlier_ones(http, job):
    schema = pa.schema([("key", pa.string()), ("value", pa.float64())])
    good = pa.record_batch([pa.array(["a", "b"]), pa.array([1.0, 2.0])], schema)
    bad_utf8 = pa.record_batch([invalid_utf8(), pa.array([3.0])], schema)
    problem(post(http, job, "total", "add", batches(schema, [good, bad_utf8])), 400, "malformed_body")
    nan = pa.record_batch([pa.array(["c"]), pa.array([math.nan])], schema)
    body = problem(post(http, job, "total", "add", batches(schema, [good, nan])), 422, "invalid_value")
    assert body["detail"].startswith("row 2") and body["row"] == 2  # rows count across batches
    assert read_values(post(http, job, "total", "get", arrow(key=["a", "b", "c"]))) == [None, None, None]
    sliced = pa.record_batch([pa.array(["z", "a", "b"]).slice(1), pa.array([0.0, 1.0, 2.0]).slice(1)], schema)
    assert post(http, job, "total", "add", batches(schema, [sliced, sliced])).json()["rows"] == 4
    assert read_values(post(http, job, "total", "get", arrow(key=["a", "b", "z"]))) == [2.0, 4.0, None]


def test_more_batches_than_rows_allowed_are_refused_before_decoding(http, job, server):
    """Each batch costs Python work on the event loop before a row is seen (120,000 empty ones
    held /healthz ~2.5 s): a stream may hold at most STATEHOUSE_MAX_BATCH_OPS (10,000) of them."""
    schema = pa.schema([("key", pa.dictionary(pa.int32(), pa.string()))])
    empty = pa.record_batch([pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), ["a"])], schema)
    with health_probe(server) as probe:
        r = post(http, job, "seen", "get", batches(schema, [empty] * 120_000))
    assert "10000 record batch messages" in problem(r, 413, "batch_too_large")["detail"]
    assert probe["failures"] == 0, probe
    one_row = pa.record_batch([pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()), ["a"])], schema)
    assert len(read_values(post(http, job, "seen", "get", batches(schema, [one_row] * 10_000)))) == 10_000


# -- keys ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "key", "expected"),
    [
        ("seen", pa.array(["ls"], pa.large_string()), "ls"),
        ("seen", pa.array(["sv"], pa.string_view()), "sv"),
        ("seen", pa.array(["de"]).dictionary_encode(), "de"),
        ("seen", pa.array(["x", "sl", "y"]).slice(1, 1), "sl"),
        ("by_int", pa.array([-3], pa.int8()), "-3"),
        ("by_int", pa.array([7], pa.uint32()), "7"),
        ("by_int", pa.array([2**31 - 1], pa.int64()), str(2**31 - 1)),
        ("by_int", pa.DictionaryArray.from_arrays(pa.array([0], pa.int8()), pa.array([9], pa.int32())), "9"),
        ("by_id", pa.array([-300], pa.int16()), "-300"),
        ("by_id", pa.array([INT64_MAX], pa.uint64()), str(INT64_MAX)),
    ],
)
def test_keys_of_other_plausible_types_mean_the_same_keys(http, job, state, key, expected):
    post(http, job, state, "put", arrow(key=key, value=[42])).raise_for_status()
    assert stored(http, job, state, expected) == 42


@pytest.mark.parametrize(
    ("state", "key"),
    [
        ("seen", pa.array([b"a"])),
        ("seen", pa.array([b"a"], pa.large_binary())),
        ("seen", pa.array([b"a"], pa.binary_view())),
        ("seen", pa.array([True])),
        ("seen", pa.nulls(1)),
        ("seen", pa.array([1], pa.int64())),
        ("seen", pa.array([{"a": 1}])),
        ("seen", pa.array([["a"]])),
        ("seen", pa.array([b"0123456789abcdef"], pa.uuid())),
        ("seen", pa.array(['"a"'], pa.json_())),
        ("seen", pa.array(["a", None])),
        ("seen", invalid_utf8()),
        ("by_int", pa.array([2**31], pa.int64())),
        ("by_int", pa.array([2**32 - 1], pa.uint32())),
        ("by_int", pa.array([1.0])),
        ("by_int", pa.array([True])),
        ("by_id", pa.array([2**64 - 1], pa.uint64())),
        ("by_id", pa.array([2**63] * 13, pa.uint64())),  # past 12 rows: the numpy path
        ("by_id", pa.array([decimal.Decimal(1)])),
        ("by_id", pa.array([1], pa.timestamp("ms"))),
        ("by_id", pa.array([1], pa.float16())),
    ],
)
def test_keys_of_wrong_types_or_ranges_are_refused(http, job, state, key):
    r = post(http, job, state, "put", arrow(key=key, value=[1] * len(key)))
    if r.status_code == 400:  # invalid UTF-8 is not a valid Arrow stream at all
        problem(r, 400, "malformed_body")
    else:
        problem(r, 422, "invalid_key")


# -- values ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "value", "expected"),
    [
        ("seen", pa.array([1.5], pa.float16()), 1.5),
        ("seen", pa.array(["sv"], pa.string_view()), "sv"),
        ("seen", pa.array(["ls"], pa.large_string()), "ls"),
        ("seen", pa.array([b"bv"], pa.binary_view()), "YnY="),  # bytes read back base64 in JSON
        ("seen", pa.array([b"abcd"], pa.binary(4)), "YWJjZA=="),
        ("seen", pa.array([2**64 - 1], pa.uint64()), 2**64 - 1),
        ("seen", pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int64())), {"a": 1}),
        ("seen", pa.array([{}], pa.struct([])), {}),
        ("seen", pa.array(["zz"]).dictionary_encode(), "zz"),
        ("seen", pa.array([[None, None]], pa.list_(pa.null())), [None, None]),
        ("words", pa.array([["a"]], pa.large_list(pa.string())), ["a"]),
        ("words", pa.array([["a", "b"]], pa.list_(pa.string(), 2)), ["a", "b"]),
        ("props", pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int64())), {"a": 1}),
    ],
)
def test_values_of_other_plausible_types_are_stored_as_their_python_values(http, job, state, value, expected):
    post(http, job, state, "put", arrow(key=["a"], value=value)).raise_for_status()
    assert stored(http, job, state, "a") == expected


def test_a_fixed_size_list_adds_all_its_elements_to_a_list_state_as_a_list_does(http, job):
    post(http, job, "words", "add", arrow(key=["a"], value=pa.array([["x", "y"]], pa.list_(pa.string(), 2))))
    post(http, job, "words", "add", arrow(key=["a"], value=pa.array([["z"]], pa.list_(pa.string()))))
    assert stored(http, job, "words", "a") == ["x", "y", "z"]


@pytest.mark.parametrize(
    ("state", "op", "value", "status", "code"),
    [
        ("seen", "put", pa.array([decimal.Decimal("1.5")]), 422, "invalid_value"),
        ("seen", "put", pa.array([decimal.Decimal("1.5")], pa.decimal256(10, 2)), 422, "invalid_value"),
        ("seen", "put", pa.array([1], pa.timestamp("ms", tz="UTC")), 422, "invalid_value"),
        ("seen", "put", pa.array([1], pa.date32()), 422, "invalid_value"),
        ("seen", "put", pa.array([1], pa.time64("us")), 422, "invalid_value"),
        ("seen", "put", pa.array([1], pa.duration("s")), 422, "invalid_value"),
        ("seen", "put", pa.array([pa.MonthDayNano([1, 2, 3])], pa.month_day_nano_interval()), 422, "invalid_value"),
        ("seen", "put", pa.array([b"0123456789abcdef"], pa.uuid()), 422, "invalid_value"),
        ("seen", "put", pa.array([math.nan], pa.float32()), 422, "invalid_value"),
        ("seen", "put", pa.array([[(1, 1)]], pa.map_(pa.int64(), pa.int64())), 422, "invalid_value"),
        ("seen", "put", pa.array([{"m": [math.inf]}]), 422, "invalid_value"),
        ("props", "put", pa.array([[(1, 1)]], pa.map_(pa.int64(), pa.int64())), 422, "invalid_key"),
        ("props", "put", pa.array(["not a map"]), 422, "invalid_argument"),
        ("words", "put", pa.array([["a", None]]), 422, "invalid_value"),
        ("words", "add", pa.array([["a", None]]), 422, "invalid_value"),
        ("total", "add", pa.array([True]), 422, "invalid_value"),
        ("total", "add", pa.array([decimal.Decimal("1.5")]), 422, "invalid_value"),
        ("total", "add", pa.array([math.inf], pa.float32()), 422, "invalid_value"),
        ("anysum", "add", pa.array(["x"]), 422, "invalid_value"),
        ("isum", "add", pa.array([2**63], pa.uint64()), 422, "invalid_value"),
        ("blob", "put", pa.array(["text"]), 422, "invalid_value"),
    ],
)
def test_values_that_cannot_be_stored_are_refused(http, job, state, op, value, status, code):
    problem(post(http, job, state, op, arrow(key=["a"], value=value)), status, code)
    assert stored(http, job, state, "a") is None


@pytest.mark.parametrize(
    ("state", "op", "value"),
    [
        ("seen", "put", pa.StructArray.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"])),
        ("items", "add", one_list(pa.StructArray.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"]))),
    ],
    ids=["value", "list-element"],
)
def test_a_struct_with_duplicate_field_names_is_refused(http, job, state, op, value):
    r = post(http, job, state, op, arrow(key=["a"], value=value))
    assert r.status_code == 422 and r.json()["code"] in ("invalid_value", "invalid_argument"), r.text
    assert stored(http, job, state, "a") is None


def test_nesting_as_deep_as_arrow_reads_round_trips(http, job):
    """pyarrow refuses to read (and write) types nested 64 levels or more; 63 is stored as sent."""
    kind, value = pa.int64(), 1
    for depth in range(63):
        kind, value = (pa.list_(kind), [value]) if depth % 2 else (pa.struct([("a", kind)]), {"a": value})
    post(http, job, "seen", "put", arrow(key=["a"], value=pa.array([value], kind))).raise_for_status()
    assert stored(http, job, "seen", "a") == value


def test_sums_that_overflow_are_refused_and_keep_the_last_value(http, job):
    for state, values in [
        ("total", [1e308, 1e308]),  # a double overflows
        ("total", [1.0, math.nan]),
        ("anysum", [INT64_MAX, INT64_MAX, INT64_MAX]),  # past 2**64: no 64-bit integer holds it
        ("anysum", [-(2**63), -1]),
        ("isum", [-(2**63), -1]),
    ]:
        problem(post(http, job, state, "add", arrow(key=["a"] * len(values), value=values)), 422, "invalid_value")
        assert stored(http, job, state, "a") is None
    post(http, job, "anysum", "add", arrow(key=["b", "b"], value=[INT64_MAX, INT64_MAX])).raise_for_status()
    assert stored(http, job, "anysum", "b") == 2**64 - 2  # an untyped sum holds what msgpack does: < 2**64


def test_an_int64_sum_that_overflows_int64_is_refused(http, job):
    problem(post(http, job, "isum", "add", arrow(key=["a", "a"], value=[INT64_MAX, 1])), 422, "invalid_value")
    assert stored(http, job, "isum", "a") is None
    assert read_values(post(http, job, "isum", "get", arrow(key=["a", "b"]))) == [None, None]


def test_map_user_keys_and_namespaces_must_be_utf8(http, job):
    for columns in (
        {"key": ["a"], "user_key": pa.array([b"u"]), "value": [1]},
        {"key": ["a"], "user_key": pa.array(["u"], pa.string_view()), "value": [1]},
        {"key": ["a"], "user_key": pa.array([1]), "value": [1]},
        {"key": ["a"], "user_key": pa.array([None], pa.string()), "value": [1]},
    ):
        problem(post(http, job, "tags", "map_put", arrow(**columns)), 422, "invalid_argument")
    for ns in (pa.array([b"n"]), pa.array([1]), pa.array(["n"], pa.string_view())):
        problem(post(http, job, "seen", "put", arrow(key=["a"], value=[1], ns=ns)), 422, "invalid_argument")
    assert stored(http, job, "tags", "a") is None and stored(http, job, "seen", "a") is None


# -- query parameters and headers --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({"epoch": str(10**30)}, 422, "invalid_argument"),
        ({"epoch": "\u0663"}, 422, "invalid_argument"),  # an Arabic-Indic 3: a digit, not ASCII
        ({"epoch": ""}, 422, "invalid_argument"),
        ({"epoch": " 1"}, 422, "invalid_argument"),
        ({"epoch": "0x10"}, 422, "invalid_argument"),
        ({"epoch": "99999999999999999999"}, 422, "invalid_argument"),  # epochs are int64
        ({"epoch": "0", "partition": "-1", "attempt": "a", "seq": "0"}, 422, "invalid_argument"),
        ({"epoch": "0", "partition": str(10**30), "attempt": "a", "seq": "0"}, 422, "invalid_argument"),
        ({"epoch": "0", "partition": str(2**31), "attempt": "a", "seq": "0"}, 422, "invalid_argument"),
        ({"epoch": "0", "partition": "0", "attempt": "a", "seq": str(10**30)}, 422, "invalid_argument"),
        ({"epoch": "0", "partition": "0", "attempt": "a" * 129, "seq": "0"}, 422, "invalid_argument"),
        ({"epoch": "0", "partition": "0", "attempt": "a" * 8000, "seq": "0"}, 422, "invalid_argument"),
        ({"epoch": "0", "partition": "0", "attempt": "a\u00e9", "seq": "0"}, 422, "invalid_argument"),
        ({"epoch": "0", "partition": "0", "attempt": "", "seq": "0"}, 422, "invalid_argument"),
        # A job starts with epoch 0 committed: nothing more is staged under it.
        ({"epoch": "0", "partition": "0", "attempt": "a", "seq": "5"}, 409, "epoch_sealed"),
        ({"epoch": "0", "attempt": "a", "seq": "0"}, 422, "invalid_argument"),
    ],
)
def test_odd_attempt_parameters_are_refused(http, job, params, status, code):
    problem(post(http, job, "total", "add", arrow(key=["a"], value=[1.0]), params=params), status, code)
    assert stored(http, job, "total", "a") is None
    assert http.get(f"{job}/epochs/0").json()["attempts"] == []


def test_a_hostile_body_in_a_task_attempt_stages_nothing_and_keeps_its_seq(http, job):
    http.post(f"{job}/fence", json={"epoch": 3}).raise_for_status()
    attempt = {"epoch": 3, "partition": 0, "attempt": "t1", "seq": 0}
    repeated = pa.DictionaryArray.from_arrays(pa.array(np.zeros(1000, np.int32)), ["x" * 100_000])
    bomb = arrow(key=["a"] * 1000, value=[1.0] * 1000, ns=repeated)
    problem(post(http, job, "total", "add", bomb, params=attempt), 413, "body_too_large")
    problem(post(http, job, "total", "add", arrow(key=["a"], value=[1.0])[:50], params=attempt), 400, "malformed_body")
    compressed = stream(pa.table({"key": ["a"], "value": [1.0]}), compression="zstd")
    problem(post(http, job, "total", "add", compressed, params=attempt), 415, "unsupported_media_type")
    assert http.get(f"{job}/epochs/3").json()["attempts"] == []
    r = post(http, job, "total", "add", arrow(key=["a", "b"], value=[1.0, 2.0]), params=attempt)
    assert r.json() == {"op": "add", "rows": 2, "staged": True}  # seq 0 was still free
    assert [a["ops"] for a in http.get(f"{job}/epochs/3").json()["attempts"]] == [2]


def test_repeated_query_parameters_take_the_last(http, job):
    """Starlette's query_params.get answers the last of repeated parameters (as a JSON object's
    repeated member does in the batch body): pinned so that a change is deliberate."""
    r = post(http, job, "total", "add", arrow(key=["a"], value=[1.0]), params=[("epoch", "0"), ("epoch", "7")])
    assert problem(r, 409, "stale_epoch")["epoch"] == 0
    assert stored(http, job, "total", "a") is None


@pytest.mark.parametrize(
    ("content_type", "ok"),
    [
        ("application/vnd.apache.arrow.stream; charset=utf-8", True),
        ("APPLICATION/VND.APACHE.ARROW.STREAM", True),
        ("application/vnd.apache.arrow.file", False),
        ("", False),
        ("application/json", False),
    ],
)
def test_content_types(http, job, content_type, ok):
    r = http.post(
        f"{job}/states/seen/columns/put", content=arrow(key=["a"], value=[1]), headers={"content-type": content_type}
    )
    if ok:
        assert r.json()["rows"] == 1
    else:
        problem(r, 415, "unsupported_media_type")
        assert stored(http, job, "seen", "a") is None


def test_metadata_and_unknown_extensions_are_ignored(http, job):
    table = pa.table({"key": ["a"], "value": [1]}).replace_schema_metadata({"x" * 100: "y" * MB})
    post(http, job, "seen", "put", stream(table)).raise_for_status()
    assert stored(http, job, "seen", "a") == 1

    class Opaque(pa.ExtensionType):  # unknown to the server: read as its storage, utf8
        def __init__(self):
            super().__init__(pa.string(), "hostile.opaque")

        def __arrow_ext_serialize__(self):
            return b""

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type, serialized):
            return cls()

    opaque = pa.ExtensionArray.from_storage(Opaque(), pa.array(["b"]))
    post(http, job, "seen", "put", arrow(key=opaque, value=opaque)).raise_for_status()
    assert stored(http, job, "seen", "b") == "b"


def test_the_replica_is_healthy_after_all_this(server, http, job):
    assert healthy(server)
    assert read_values(post(http, job, "seen", "get", arrow(key=["a"]))) == [None]
