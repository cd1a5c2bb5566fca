"""Raw keyed and operator state: streams per key group and partitions per subtask that
travel with every kind of snapshot and are redistributed on restore as Flink's raw state is.

Engine level on both backends (real heap and RocksDB stores, a real checkpoint manager) for the
snapshot kinds and rescales; Flink's repartitioner vectors for raw operator state; one server
for the HTTP contract and its 4xx answers."""

from __future__ import annotations

import uuid

import httpx
import msgpack
import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.errors import KeyNotOwned
from statehouse.backends.heap import HeapStore
from statehouse.backends.limits import Limits, RawStreamTooLarge
from statehouse.backends.operator_state import operator_subtasks_row
from statehouse.backends.raw_state import DEFAULT_NAME, raw_operator
from statehouse.backends.redistribution import OperatorSubtaskState, redistribute
from statehouse.backends.snapshot.operator_format import OperatorSnapshot, merge_for_replica
from statehouse.protocol.errors import InvalidArgument
from statehouse.snapshots.storage import open_storage
from tests.support.flink_vectors import load, operator_expected, operator_input
from tests.support.job_contents import global_checkpoint
from tests.support.server import start_server

MAX_PARALLELISM = 128
OLD_SUBTASKS = 5  # the operator's parallelism before the restore


def _stream(kg: int, version: int = 0) -> tuple[bytes, bytes]:
    """Two parts of key group ``kg``'s stream: every byte value, so nothing is text-mangled."""
    return bytes(range(kg % 256, 256)) + f"kg{kg}".encode(), bytes([kg % 256, 0, 255, version]) * (kg % 7)


def _partitions(subtask: int) -> list[bytes]:
    return [f"s{subtask}p{p}".encode() + b"\x00\xff" for p in range(subtask + 1)]


def _snapshot(make_manager, catalogs, storage, kind: str, second: bool):
    """Checkpoint (or savepoint) 1 of every replica; with ``second``, change some streams and take
    checkpoint 2 (incremental: it reuses checkpoint 1's SST files). Returns the id to restore."""
    managers = [make_manager(c, storage) for c in catalogs]
    ids = [1, 2] if second else [1]
    for checkpoint_id in ids:
        if checkpoint_id == 2:
            for catalog in catalogs:
                job = catalog.get("orders")
                with job.transaction() as tx:
                    for kg in job.key_group_range:
                        if kg % 5 == 0:
                            tx.raw_keyed.replace(kg, b"".join(_stream(kg, 2)))
        global_checkpoint(managers, "orders", checkpoint_id, kind)
    for m in managers:
        m.close()
    return ids[-1]


# Incremental checkpoints: RocksDB's, or the heap backend's changelog.
SNAPSHOTS = [
    ("heap", "full"),
    ("heap", "incremental"),
    ("heap", "savepoint"),
    ("rocksdb", "full"),
    ("rocksdb", "incremental"),
    ("rocksdb", "savepoint"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "kind"), SNAPSHOTS, indirect=["backend"])
@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2)])
def test_raw_state_travels_with_snapshots(backend, make_catalog, make_manager, tmp_path, kind, old, new):
    storage = open_storage(f"memory://{uuid.uuid4().hex}")
    before = [make_catalog(i, old, tmp_path / f"old-{i}", incremental=kind == "incremental") for i in range(old)]
    expected: dict[int, bytes] = {}
    for catalog in before:
        job, _ = catalog.create("orders", MAX_PARALLELISM)
        with job.transaction() as tx:
            for kg in job.key_group_range:  # a stream for every key group, some in two parts
                first, rest = _stream(kg)
                tx.raw_keyed.replace(kg, first)
                assert tx.raw_keyed.append(kg, rest) == len(first) + len(rest)
                expected[kg] = first + rest
            for subtask in range(catalog.replica_index, OLD_SUBTASKS, old):
                tx.raw_operator.add("src", subtask, _partitions(subtask)[:1])
                tx.raw_operator.add("src", subtask, _partitions(subtask)[1:])
                tx.operator.list_update("src", subtask, "offsets", [subtask])  # managed state beside it
    assert sorted(expected) == list(range(MAX_PARALLELISM))
    restore_id = _snapshot(
        make_manager, before, storage, "checkpoint" if kind != "savepoint" else kind, kind == "incremental"
    )
    if kind == "incremental":
        expected.update({kg: b"".join(_stream(kg, 2)) for kg in expected if kg % 5 == 0})

    after = [make_catalog(i, new, tmp_path / f"new-{i}") for i in range(new)]
    found: dict[int, bytes] = {}
    raw_lists: dict[int, list[bytes]] = {}
    managed: dict[int, list[int]] = {}
    for catalog in after:
        make_manager(catalog, storage).restore("orders", restore_id, operator_parallelism={"src": new})
        job = catalog.get("orders")
        with job.transaction() as tx:
            for kg in job.key_group_range:
                found[kg] = tx.raw_keyed.get(kg)
            outside = (job.key_group_range.end + 1) % MAX_PARALLELISM
            with pytest.raises(KeyNotOwned) as refused:
                tx.raw_keyed.get(outside)
            assert refused.value.owner == job.keyspace.owner_of(outside)
            for subtask in range(catalog.replica_index, new, new):
                raw_lists[subtask] = tx.raw_operator.partitions("src", subtask)
                managed[subtask] = tx.operator.list_get("src", subtask, "offsets") or []
    assert found == expected  # every stream on its owner, byte for byte

    # Raw partitions go through Flink's repartitioner on their own (start 0, one name), managed
    # lists through theirs: the operator's parallelism is the one both had.
    want_raw = redistribute(
        [OperatorSubtaskState(lists={DEFAULT_NAME: ("split", _partitions(s))}) for s in range(OLD_SUBTASKS)], new
    )
    assert raw_lists == {s: want_raw[s].lists.get(DEFAULT_NAME, ("split", []))[1] for s in range(new)}
    want_managed = redistribute(
        [OperatorSubtaskState(lists={"offsets": ("split", [s])}) for s in range(OLD_SUBTASKS)], new
    )
    assert managed == {s: want_managed[s].lists.get("offsets", ("split", []))[1] for s in range(new)}


# -- raw operator state against Flink's own repartitioner ----------------------------------------


def test_raw_operator_partitions_follow_flinks_repartitioner():
    """Flink snapshots raw operator state as one SPLIT_DISTRIBUTE entry named ``_default_`` and
    repartitions it with ``RoundRobinOperatorStateRepartitioner`` in a call of its own: exactly
    the committed vectors' cases of one split state (321 of them, 183 rescaling). Each case's
    elements become raw partitions of the old subtasks, spread over two replica parts as a
    snapshot has them, and every new subtask must get Flink's partitions."""
    cases = [c for c in load()["operator"] if len(c["names"]) == 1 and c["modes"] == "S"]
    assert len(cases) >= 300 and sum(c["old"] != c["new"] for c in cases) >= 150
    stored = raw_operator("op")
    mismatches = []
    for case in cases:
        parts = [OperatorSnapshot(), OperatorSnapshot()]
        parts[0].meta[operator_subtasks_row(stored)] = str(case["old"]).encode()
        for s, handle in enumerate(operator_input(case)):
            for _name, _mode, elements in handle or []:
                if elements:
                    records = b"".join(msgpack.packb(e.encode(), use_bin_type=True) for e in elements)
                    parts[s % 2].lists[(stored, DEFAULT_NAME, s)] = records
        got: list[dict[str, tuple[str, list[str]]]] = [{} for _ in range(case["new"])]
        for replica in range(3):
            merged = merge_for_replica(parts, replica, 3, {"op": case["new"]})
            for (operator, name, sub), raw in merged.lists.items():
                assert operator == stored and name == DEFAULT_NAME
                unpacker = msgpack.Unpacker(raw=False)
                unpacker.feed(raw)
                got[sub][case["names"][0]] = ("split", [e.decode() for e in unpacker])
        if got != operator_expected(case):
            mismatches.append(case)
    assert mismatches == []


def test_raw_and_managed_state_share_the_operators_parallelism():
    """Subtasks 0-3 wrote raw partitions, only 0-1 managed lists: the operator had 4 subtasks, so a
    restore to 2 is a rescale for its managed lists too (Flink's old parallelism is the operator's)."""
    catalog = JobCatalog(HeapStore())
    job, _ = catalog.create("j", 8)
    with job.transaction() as tx:
        tx.operator.list_update("src", 0, "offsets", [1, 2, 3])
        tx.operator.list_update("src", 1, "offsets", [4])
        for subtask in range(4):
            tx.raw_operator.add("src", subtask, [bytes([subtask])])
    view = job.partition.freeze()
    try:
        snap = OperatorSnapshot.from_bytes(OperatorSnapshot.from_view(view).to_bytes())
    finally:
        view.release()
    merged = merge_for_replica([snap], 0, 1, {"src": 2})
    got = {}
    for (operator, _name, sub), raw in merged.lists.items():
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(raw)
        got[(operator, sub)] = list(unpacker)
    assert got == {
        ("src", 0): [1, 2],
        ("src", 1): [3, 4],
        (raw_operator("src"), 0): [b"\x00", b"\x01"],
        (raw_operator("src"), 1): [b"\x02", b"\x03"],
    }
    catalog.close()


# -- the engine's refusals ----------------------------------------------------------------------


def test_refusals_change_nothing():
    limits = Limits(max_raw_stream_bytes=10)
    catalog = JobCatalog(HeapStore(), replica_index=0, replica_count=2, limits=limits)
    job, _ = catalog.create("j", 8)  # this replica owns key groups 0-3
    with job.transaction() as tx:
        tx.raw_keyed.replace(1, b"12345")
        tx.raw_operator.add("op", 0, [b"abc"])
    with job.transaction() as tx:
        with pytest.raises(RawStreamTooLarge):
            tx.raw_keyed.append(1, b"123456")
        with pytest.raises(RawStreamTooLarge):
            tx.raw_operator.add("op", 0, [b"12345678"])  # 3 + 8 of the partitions' own bytes
        with pytest.raises(InvalidArgument):
            tx.raw_keyed.get(8)
        with pytest.raises(KeyNotOwned):
            tx.raw_keyed.replace(4, b"x")
        assert tx.raw_keyed.get(1) == b"12345" and tx.raw_operator.partitions("op", 0) == [b"abc"]
        tx.raw_keyed.replace(1, b"")  # an empty stream is none
        assert tx.raw_keyed.get(1) is None and tx.raw_keyed.get(2) is None
    catalog.close()


# -- over HTTP ----------------------------------------------------------------------------------

OCTETS = {"Content-Type": "application/octet-stream"}
MSGPACK = {"Content-Type": "application/msgpack"}


def test_http_contract(http: httpx.Client, job_name: str):
    job = f"/jobs/{job_name}"
    http.put(job, json={"max_parallelism": 16}).raise_for_status()
    base = f"{job}/raw/key-groups"
    _problem(http.get(f"{base}/3"), 404, "key_not_found")  # nothing written
    assert http.put(f"{base}/3", content=b"\x00head", headers=OCTETS).status_code == 204
    r = http.post(f"{base}/3/append", content=b"\xfftail", headers=OCTETS)
    assert r.status_code == 200 and r.json() == {"length": 10}
    r = http.get(f"{base}/3")
    assert r.headers["content-type"] == "application/octet-stream" and r.content == b"\x00head\xfftail"
    assert http.delete(f"{base}/3").status_code == 204
    _problem(http.get(f"{base}/3"), 404, "key_not_found")

    sub = f"{job}/operators/src/subtasks/2/raw"
    for part in (b"\x00a", b"b\xff"):
        assert http.post(f"{sub}/partitions", content=part, headers=OCTETS).status_code == 204
    got = http.get(sub, headers={"Accept": "application/msgpack"})
    assert msgpack.unpackb(got.content) == {"partitions": [b"\x00a", b"b\xff"]}
    assert http.get(sub).json() == {"partitions": ["AGE=", "Yv8="]}  # JSON: base64
    replaced = msgpack.packb({"partitions": [b"x", b""]}, use_bin_type=True)
    assert http.put(sub, content=replaced, headers=MSGPACK).status_code == 204
    assert msgpack.unpackb(http.get(sub, headers={"Accept": "application/msgpack"}).content) == {
        "partitions": [b"x", b""]
    }
    assert http.put(sub, json={"partitions": ["AGE=", ""]}).status_code == 204  # JSON: base64, as read
    assert http.get(sub).json() == {"partitions": ["AGE=", ""]}
    assert http.delete(sub).status_code == 204
    _problem(http.get(sub), 404, "key_not_found")
    for bad, code in (([b"x"], "invalid_argument"), ({"partitions": ["text"]}, "invalid_value")):
        _problem(http.put(sub, content=msgpack.packb(bad), headers=MSGPACK), 422, code)
    _problem(http.put(sub, json={"partitions": ["not base64!"]}), 422, "invalid_value")
    _problem(http.put(sub, json={"partitions": [b"x".hex()], "more": 1}), 422, "invalid_argument")
    _problem(http.put(sub, content=b"\xc1", headers=MSGPACK), 400, "malformed_body")
    _problem(http.get(sub), 404, "key_not_found")  # nothing of a refused write


def test_http_limit(http: httpx.Client, job_name: str):
    """Past STATEHOUSE_MAX_RAW_STREAM_BYTES (16 MiB by default): 413, and the stream as it was."""
    job = f"/jobs/{job_name}"
    http.put(job, json={"max_parallelism": 16}).raise_for_status()
    part = b"\x01" * (9 << 20)
    assert http.post(f"{job}/raw/key-groups/0/append", content=part, headers=OCTETS).json() == {"length": 9 << 20}
    _problem(http.post(f"{job}/raw/key-groups/0/append", content=part, headers=OCTETS), 413, "raw_stream_too_large")
    _problem(http.put(f"{job}/raw/key-groups/0", content=part * 2, headers=OCTETS), 413, "raw_stream_too_large")
    sub = f"{job}/operators/src/subtasks/0/raw/partitions"
    assert http.post(sub, content=part, headers=OCTETS).status_code == 204
    _problem(http.post(sub, content=part, headers=OCTETS), 413, "raw_stream_too_large")
    assert len(http.get(f"{job}/raw/key-groups/0").content) == 9 << 20


RAW_LIMIT = 1000  # STATEHOUSE_MAX_RAW_STREAM_BYTES of the small_raw server


@pytest.fixture(scope="module")
def small_raw(tmp_path_factory):
    """A server whose raw keyed streams and subtasks' raw partitions may hold RAW_LIMIT bytes."""
    srv = start_server(
        tmp_path_factory.mktemp("small-raw"),
        {"STATEHOUSE_BACKEND": "rocksdb", "STATEHOUSE_MAX_RAW_STREAM_BYTES": str(RAW_LIMIT)},
    )
    try:
        with httpx.Client(base_url=srv.url + "/v1", timeout=30) as client:
            yield client
    finally:
        srv.stop()


def _too_large(r: httpx.Response, would_be: int) -> None:
    """413 naming the setting and the client's bytes the write would have made."""
    _problem(r, 413, "raw_stream_too_large")
    detail = r.json()["detail"]
    assert "STATEHOUSE_MAX_RAW_STREAM_BYTES" in detail and f"would be {would_be} bytes" in detail, detail


def _raw_partitions(http: httpx.Client, sub: str) -> list[bytes]:
    return msgpack.unpackb(http.get(sub, headers={"Accept": "application/msgpack"}).content)["partitions"]


def test_http_limit_is_the_clients_bytes_keyed(small_raw: httpx.Client, job_name: str):
    """A raw keyed stream of exactly the limit, in one write or in parts, is stored and read back;
    one byte more is 413 and the stream stays as it was."""
    http, job = small_raw, f"/jobs/{job_name}"
    http.put(job, json={"max_parallelism": 16}).raise_for_status()
    stream = bytes(range(256)) * (RAW_LIMIT // 256) + b"\xff" * (RAW_LIMIT % 256)
    assert http.put(f"{job}/raw/key-groups/0", content=stream, headers=OCTETS).status_code == 204
    assert http.get(f"{job}/raw/key-groups/0").content == stream
    _too_large(http.post(f"{job}/raw/key-groups/0/append", content=b"x", headers=OCTETS), RAW_LIMIT + 1)
    _too_large(http.put(f"{job}/raw/key-groups/1", content=stream + b"x", headers=OCTETS), RAW_LIMIT + 1)
    for part in (stream[:1], stream[1:400], stream[400:]):  # appends whose sum is the limit
        assert http.post(f"{job}/raw/key-groups/1/append", content=part, headers=OCTETS).status_code == 200
    _too_large(http.post(f"{job}/raw/key-groups/1/append", content=b"x", headers=OCTETS), RAW_LIMIT + 1)
    assert http.get(f"{job}/raw/key-groups/0").content == stream
    assert http.get(f"{job}/raw/key-groups/1").content == stream


def test_http_limit_is_the_clients_bytes_operator(small_raw: httpx.Client, job_name: str):
    """A subtask's raw partitions totalling exactly the limit, one partition or several, through
    the partition append, the replace and the batch, are stored and read back; one byte more is
    413 and the partitions stay as they were."""
    http, job = small_raw, f"/jobs/{job_name}"
    http.put(job, json={"max_parallelism": 16}).raise_for_status()
    whole = bytes(range(256)) * (RAW_LIMIT // 256) + b"\x00" * (RAW_LIMIT % 256)
    parts = [whole[:1], whole[1:2], whole[2:300], whole[300:]]  # several; the sum is the limit

    one = f"{job}/operators/src/subtasks/0/raw"
    assert http.post(f"{one}/partitions", content=whole, headers=OCTETS).status_code == 204
    assert _raw_partitions(http, one) == [whole]
    assert http.post(f"{one}/partitions", content=b"", headers=OCTETS).status_code == 204  # no byte more
    _too_large(http.post(f"{one}/partitions", content=b"x", headers=OCTETS), RAW_LIMIT + 1)

    several = f"{job}/operators/src/subtasks/1/raw"
    for part in parts:
        assert http.post(f"{several}/partitions", content=part, headers=OCTETS).status_code == 204
    _too_large(http.post(f"{several}/partitions", content=b"x", headers=OCTETS), RAW_LIMIT + 1)
    assert _raw_partitions(http, several) == parts

    replaced = f"{job}/operators/src/subtasks/2/raw"
    body = {"partitions": parts}
    assert http.put(replaced, content=msgpack.packb(body, use_bin_type=True), headers=MSGPACK).status_code == 204
    assert _raw_partitions(http, replaced) == parts
    over = {"partitions": [*parts, b"x"]}
    _too_large(http.put(replaced, content=msgpack.packb(over, use_bin_type=True), headers=MSGPACK), RAW_LIMIT + 1)

    batched = {"op": "raw_operator_put", "operator": "src", "subtask": 3, "value": parts}
    assert _results(_batch(http, job, [batched])) == [{}]
    assert _raw_partitions(http, f"{job}/operators/src/subtasks/3/raw") == parts
    _too_large(_batch(http, job, [{**batched, "value": [*parts, b"x"]}]), RAW_LIMIT + 1)
    assert _raw_partitions(http, one) == [whole, b""] and _raw_partitions(http, replaced) == parts


def _problem(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json" and r.json()["code"] == code, r.text


def test_http_bad_input(http: httpx.Client, job_name: str):
    job = f"/jobs/{job_name}"
    http.put(job, json={"max_parallelism": 16}).raise_for_status()
    http.post(f"{job}/fence", json={"epoch": 2}).raise_for_status()
    _problem(http.put(f"{job}/raw/key-groups/1", params={"epoch": 1}, content=b"x", headers=OCTETS), 409, "stale_epoch")
    assert http.put(f"{job}/raw/key-groups/1", params={"epoch": 2}, content=b"x", headers=OCTETS).status_code == 204
    base = f"{job}/raw/key-groups"
    _problem(http.get(f"{base}/16"), 422, "invalid_argument")  # not below max_parallelism
    _problem(http.get(f"{base}/-1"), 422, "validation_error")
    _problem(http.get(f"{base}/01"), 422, "validation_error")
    _problem(
        http.put(f"{base}/1", content=b"x", headers={"Content-Type": "application/json"}), 415, "unsupported_media_type"
    )
    _problem(http.post(f"{base}/1/append", content=b"x"), 415, "unsupported_media_type")
    _problem(
        http.post(f"{job}/operators/bad$name/subtasks/0/raw/partitions", content=b"x", headers=OCTETS),
        422,
        "invalid_name",
    )
    _problem(http.get(f"/jobs/{job_name}-missing/raw/key-groups/0"), 404, "job_not_found")


# -- in batches (POST /v1/jobs/{job}/batch): the same op table and staging as keyed writes ------


def _batch(http: httpx.Client, job: str, ops: list, **fields) -> httpx.Response:
    body = msgpack.packb({"ops": ops, **fields}, use_bin_type=True)
    return http.post(f"{job}/batch", content=body, headers={**MSGPACK, "Accept": "application/msgpack"})


def _results(r: httpx.Response) -> list:
    assert r.status_code == 200, r.text
    return msgpack.unpackb(r.content)["results"]


def test_http_batch_ops(http: httpx.Client, job_name: str):
    """Raw keyed and operator operations in a batch, beside keyed ones: in order, atomic, and the
    same records the REST routes read."""
    job = f"/jobs/{job_name}"
    http.put(job, json={"max_parallelism": 16}).raise_for_status()
    http.put(f"{job}/states/v", json={"kind": "value"}).raise_for_status()
    ops = [
        {"op": "raw_put", "key_group": 3, "value": b"\x00head"},
        {"op": "put", "state": "v", "key": "k", "value": 1},
        {"op": "raw_append", "key_group": 3, "value": b"\xfftail"},
        {"op": "raw_get", "key_group": 3},
        {"op": "raw_get", "key_group": 4},  # nothing written: null
        {"op": "raw_operator_put", "operator": "src", "subtask": 2, "value": [b"\x00a", b"b\xff"]},
        {"op": "raw_operator_get", "operator": "src", "subtask": 2},
        {"op": "raw_operator_get", "operator": "src", "subtask": 5},  # none: []
    ]
    assert _results(_batch(http, job, ops)) == [
        {},
        {},
        {},
        {"value": b"\x00head\xfftail"},
        {"value": None},
        {},
        {"value": [b"\x00a", b"b\xff"]},
        {"value": []},
    ]
    assert http.get(f"{job}/raw/key-groups/3").content == b"\x00head\xfftail"  # the REST routes' records
    assert http.get(f"{job}/operators/src/subtasks/2/raw").json() == {"partitions": ["AGE=", "Yv8="]}
    # JSON: bytes as base64 both ways, as the REST routes' JSON bodies carry them.
    r = http.post(
        f"{job}/batch",
        json={
            "ops": [
                {"op": "raw_append", "key_group": 3, "value": "IQ=="},
                {"op": "raw_get", "key_group": 3},
                {"op": "raw_delete", "key_group": 3},
                {"op": "raw_get", "key_group": 3},
                {"op": "raw_operator_put", "operator": "src", "subtask": 2, "value": []},
                {"op": "raw_operator_get", "operator": "src", "subtask": 2},
            ]
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["results"] == [{}, {"value": "AGhlYWT/dGFpbCE="}, {}, {"value": None}, {}, {"value": []}]
    _problem(http.get(f"{job}/raw/key-groups/3"), 404, "key_not_found")


def test_http_batch_ops_refused(http: httpx.Client, job_name: str):
    """Bad raw operations are 4xx naming the operation, and nothing of their batch is applied."""
    job = f"/jobs/{job_name}"
    http.put(job, json={"max_parallelism": 16}).raise_for_status()
    first = {"op": "raw_put", "key_group": 1, "value": b"kept?"}
    cases = [
        ({"op": "raw_get"}, 422, "invalid_argument", "missing 'key_group'"),
        ({"op": "raw_get", "key_group": "1"}, 422, "invalid_argument", "'key_group' must be"),
        ({"op": "raw_get", "key_group": 16}, 422, "invalid_argument", "in [0, 15]"),
        ({"op": "raw_put", "key_group": 1}, 422, "invalid_argument", "missing 'value'"),
        ({"op": "raw_put", "key_group": 1, "value": "text"}, 422, "invalid_argument", "must be bytes"),
        ({"op": "raw_operator_put", "operator": "src", "subtask": 0, "value": ["t"]}, 422, "invalid_value", "bytes"),
        ({"op": "raw_operator_put", "operator": "src", "subtask": -1, "value": []}, 422, "invalid_argument", "subtask"),
        ({"op": "raw_operator_get", "operator": "bad$name", "subtask": 0}, 422, "invalid_name", "operator"),
        ({"op": "raw_append", "key_group": 1, "value": b"x" * (17 << 20)}, 413, "raw_stream_too_large", "16777216"),
    ]
    for bad, status, code, says in cases:
        r = _batch(http, job, [first, bad])
        _problem(r, status, code)
        assert r.json()["op_index"] == 1 and r.json()["detail"].startswith("op 1:") and says in r.json()["detail"]
    bad_base64 = http.post(f"{job}/batch", json={"ops": [{"op": "raw_put", "key_group": 1, "value": "not base64!"}]})
    _problem(bad_base64, 422, "invalid_value")
    assert bad_base64.json()["op_index"] == 0
    _problem(http.get(f"{job}/raw/key-groups/1"), 404, "key_not_found")  # nothing of any refused batch
    http.post(f"{job}/fence", json={"epoch": 2}).raise_for_status()
    _problem(_batch(http, job, [first], epoch=1), 409, "stale_epoch")


def test_http_batch_ops_staged_under_a_task_attempt(http: httpx.Client, job_name: str):
    """Raw writes of a task attempt are staged like keyed ones: the attempt reads its own writes,
    nobody else does, a re-sent request is not applied twice, and the commit applies exactly the
    winner's (an append once); an aborted epoch leaves nothing."""
    job = f"/jobs/{job_name}"
    http.put(job, json={"max_parallelism": 16}).raise_for_status()
    assert _results(_batch(http, job, [{"op": "raw_put", "key_group": 2, "value": b"base|"}])) == [{}]
    http.post(f"{job}/fence", json={"epoch": 1}).raise_for_status()
    writes = [
        {"op": "raw_append", "key_group": 2, "value": b"win"},
        {"op": "raw_operator_put", "operator": "src", "subtask": 0, "value": [b"p"]},
        {"op": "raw_get", "key_group": 2},
    ]
    for attempt, partition in (("a", 0), ("b", 1)):
        fields = {"epoch": 1, "partition": partition, "attempt": attempt, "seq": 0}
        assert _results(_batch(http, job, writes, **fields))[2] == {"value": b"base|win"}  # read-your-writes
    again = _batch(http, job, writes, epoch=1, partition=0, attempt="a", seq=0)  # re-sent: answered again
    assert _results(again)[2] == {"value": b"base|win"}
    assert http.get(f"{job}/raw/key-groups/2").content == b"base|"  # staged: not the job's yet
    staged = http.get(f"{job}/epochs/1").json()["attempts"]
    assert [(a["attempt"], a["ops"]) for a in staged] == [("a", 2), ("b", 2)]
    body = {"attempts": [{"partition": 0, "attempt": "a", "ops": 2}]}
    http.post(f"{job}/epochs/1/prepare", json=body).raise_for_status()
    http.post(f"{job}/epochs/1/commit", json=body).raise_for_status()
    assert http.get(f"{job}/raw/key-groups/2").content == b"base|win"  # once: b's append dropped
    assert http.get(f"{job}/operators/src/subtasks/0/raw").json() == {"partitions": ["cA=="]}

    http.post(f"{job}/fence", json={"epoch": 2}).raise_for_status()
    fields = {"epoch": 2, "partition": 0, "attempt": "c", "seq": 0}
    assert _results(_batch(http, job, [{"op": "raw_delete", "key_group": 2}], **fields)) == [{}]
    http.post(f"{job}/epochs/2/abort").raise_for_status()
    assert http.get(f"{job}/raw/key-groups/2").content == b"base|win"
