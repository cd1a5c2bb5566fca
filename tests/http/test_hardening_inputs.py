"""Single bad requests that could hurt a replica, over real HTTP: every one gets a clear 4xx
problem+json, changes nothing, and leaves the connection usable. Each test names the failure
it guards against."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import msgpack
import pyarrow as pa
import pytest
import uvicorn
from fastapi import FastAPI

from statehouse.app.metrics import Metrics, MetricsMiddleware
from statehouse.snapshots.handles import StreamHandle
from tests.support.server import free_port, start_server

pytestmark = [pytest.mark.http]

JSON = {"content-type": "application/json"}
MSGPACK = {"content-type": "application/msgpack"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("hardening"), {"STATEHOUSE_BACKEND": "rocksdb"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert c.put("/v1/jobs/h", json={"max_parallelism": 128}).status_code == 201
        for state, descriptor in {
            "v": {"kind": "value"},
            "s": {"kind": "reducing", "function": "sum"},
            "n": {"kind": "value", "key_type": "int"},
        }.items():
            assert c.put(f"/v1/jobs/h/states/{state}", json=descriptor).status_code == 201
        assert c.put("/v1/jobs/h/operators/op/subtasks/0/lists/l", json={"value": [1, 2]}).status_code == 204
        yield c


def problem(response, status, code):
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["code"] == code and body["detail"], body
    return body


def stored(client, state, key):
    r = client.get(f"/v1/jobs/h/states/{state}/keys/{key}")
    return r.json()["value"] if r.status_code == 200 else None


def test_restore_with_operator_parallelism_out_of_range_is_refused_before_anything_happens(client):
    # Was: 0 and -1 gave 500; 10**9 allocated until the kernel killed the server.
    assert client.post("/v1/jobs/h/checkpoints", json={"checkpoint_id": 1}).status_code == 202
    for _ in range(100):
        if client.get("/v1/jobs/h/checkpoints/1").json()["status"] == "uploaded":
            break
        time.sleep(0.05)
    assert client.post("/v1/jobs/h/checkpoints/1/complete").status_code == 200
    for parallelism in (0, -1, 10**9, 32769, True, "2"):
        r = client.post("/v1/jobs/h/restore", json={"checkpoint_id": 1, "operator_parallelism": {"op": parallelism}})
        assert "operator_parallelism" in problem(r, 422, "validation_error")["detail"]
    assert client.get("/v1/jobs/h/operators/op/subtasks/0/lists/l").json()["value"] == [1, 2]
    r = client.post("/v1/jobs/h/restore", json={"checkpoint_id": 1, "operator_parallelism": {"op": 2}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("index", ["1000000000000000000000000000000", "32768", "-1", "1_0", "01", "+1", "%201"])
def test_subtask_indexes_are_bounded_and_canonical(client, index):
    # Was: 10**30 accepted, after which every checkpoint of the job failed with OverflowError.
    r = client.put(f"/v1/jobs/h/operators/op/subtasks/{index}/lists/l", json={"value": [9]})
    problem(r, 422, "validation_error")
    assert client.get("/v1/jobs/h/operators/op/subtasks/32767/lists/l").status_code in (200, 404)


@pytest.mark.parametrize(
    ("literal", "status", "code"),
    [
        (b"NaN", 400, "malformed_body"),
        (b"Infinity", 400, "malformed_body"),
        (b"-Infinity", 400, "malformed_body"),
        (b"1e400", 422, "invalid_value"),
        (b"18446744073709551616", 422, "invalid_value"),
        (b"-9223372036854775809", 422, "invalid_value"),
    ],
)
def test_numbers_json_cannot_round_trip_are_refused_on_every_endpoint(client, literal, status, code):
    # Was: NaN, Infinity and 1e400 stored by single-key endpoints and read back null (poisoning
    # sums); 2**64 in a JSON batch stored as a float.
    value = b'{"value": ' + literal + b"}"
    requests = [
        ("put", "/v1/jobs/h/states/v/keys/num", value),
        ("post", "/v1/jobs/h/states/s/keys/num/add", value),
        (
            "post",
            "/v1/jobs/h/batch",
            b'{"ops": [{"op": "add", "state": "s", "key": "num", "value": ' + literal + b"}]}",
        ),
        ("put", "/v1/jobs/h/operators/op/subtasks/1/lists/num", b'{"value": [' + literal + b"]}"),
    ]
    for method, path, body in requests:
        problem(client.request(method, path, content=body, headers=JSON), status, code)
    assert stored(client, "v", "num") is None and stored(client, "s", "num") is None


def test_the_largest_64_bit_integers_still_round_trip(client):
    for number in (2**64 - 1, -(2**63)):
        body = b'{"value": [' + str(number).encode() + b', "12345678901234567890123"]}'
        assert client.put("/v1/jobs/h/states/v/keys/edge", content=body, headers=JSON).status_code == 204
        assert stored(client, "v", "edge") == [number, "12345678901234567890123"]


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        msgpack.ExtType(5, b"xx"),
        {b"bytes-key": 1},
        {1: "int key"},
        [1, {"a": float("-inf")}],
    ],
    ids=["nan", "inf", "ext", "bytes-key", "int-key", "nested-inf"],
)
def test_msgpack_values_json_cannot_carry_are_refused(client, value):
    # Was: stored, then every JSON read of the key answered 500.
    ops = {"ops": [{"op": "put", "state": "v", "key": "mp", "value": value}]}
    problem(client.post("/v1/jobs/h/batch", content=msgpack.packb(ops), headers=MSGPACK), 422, "invalid_value")
    assert stored(client, "v", "mp") is None


def test_a_sum_that_overflows_a_double_is_refused_not_stored_as_infinity(client):
    assert client.post("/v1/jobs/h/states/s/keys/big/add", json={"value": 1e308}).status_code == 204
    problem(client.post("/v1/jobs/h/states/s/keys/big/add", json={"value": 1e308}), 422, "invalid_value")
    assert stored(client, "s", "big") == 1e308


@pytest.mark.parametrize("escape", ["%ff", "%fe", "%c3", "a%80b"])
def test_path_keys_that_are_not_utf8_are_refused_not_aliased(client, escape):
    # Was: %ff, %fe and %EF%BF%BD all addressed the key U+FFFD.
    problem(client.put(f"/v1/jobs/h/states/v/keys/{escape}", json={"value": escape}), 422, "invalid_argument")
    assert client.put("/v1/jobs/h/states/v/keys/%EF%BF%BD", json={"value": "fffd"}).status_code == 204
    assert stored(client, "v", "%EF%BF%BD") == "fffd"


@pytest.mark.parametrize(
    "alias", ["1_000", "%20+1000%20", "+1000", "01000", "\u0661\u0660\u0660\u0660", "1000.0", "1e3"]
)
def test_int_keys_have_one_canonical_form(client, alias):
    # Was: 1_000, " +1000 " and Arabic-Indic digits all addressed key 1000.
    assert client.put("/v1/jobs/h/states/n/keys/1000", json={"value": "canonical"}).status_code == 204
    problem(client.put(f"/v1/jobs/h/states/n/keys/{alias}", json={"value": alias}), 422, "invalid_key")
    problem(client.get(f"/v1/jobs/h/states/n/keys/{alias}"), 422, "invalid_key")
    assert stored(client, "n", "1000") == "canonical"
    assert client.put("/v1/jobs/h/states/n/keys/-7", json={"value": "negative"}).status_code == 204
    assert stored(client, "n", "-7") == "negative"


@pytest.mark.parametrize("epoch", [b"true", b'"7"', b"8.0"])
def test_fence_takes_only_an_integer(client, epoch):
    # Was: true, "7" and 8.0 accepted as epochs 1, 7 and 8.
    before = client.get("/v1/jobs/h").json()["epoch"]
    problem(
        client.post("/v1/jobs/h/fence", content=b'{"epoch": ' + epoch + b"}", headers=JSON), 422, "validation_error"
    )
    assert client.get("/v1/jobs/h").json()["epoch"] == before


def test_deeply_nested_json_is_a_malformed_body_not_http_error(client):
    # Was: 400 with code http_error, which the docs do not list.
    deep = b'{"value": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    problem(client.put("/v1/jobs/h/states/v/keys/deep", content=deep, headers=JSON), 400, "malformed_body")


def test_oversized_chunked_body_is_body_too_large_on_model_endpoints(client):
    # Was: 400 http_error (FastAPI's "There was an error parsing the body").
    def chunks():
        for _ in range(80):
            yield b" " * (1 << 20)

    r = client.put("/v1/jobs/h/states/v/keys/chunked", content=chunks(), headers=JSON)
    problem(r, 413, "body_too_large")


def test_options_and_wrong_methods_name_every_allowed_method(client):
    # Was: OPTIONS answered 405 without Allow; a 405 named one route's methods only.
    r = client.options("/v1/jobs/h")
    assert r.status_code == 204 and r.headers["allow"] == "DELETE, GET, OPTIONS, PUT"
    r = client.post("/v1/jobs/h")
    assert problem(r, 405, "method_not_allowed") and r.headers["allow"] == "DELETE, GET, OPTIONS, PUT"


def _raw_exchange(url: str, requests: list[bytes]) -> list[bytes]:
    """Send requests one after another on one TCP connection; the status lines answered."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        answers = []
        for request in requests:
            sock.sendall(request)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(65536)
                assert chunk, f"connection closed after {len(answers)} answers: {answers}"
                head += chunk
            headers, _, rest = head.partition(b"\r\n\r\n")
            length = int(
                next(h.split(b":")[1] for h in headers.split(b"\r\n") if h.lower().startswith(b"content-length"))
            )
            while len(rest) < length:
                rest += sock.recv(65536)
            answers.append(headers.split(b"\r\n")[0])
        return answers


def test_bad_requests_keep_the_connection_open(server, client):
    bad = [
        b"GET /v1/jobs/h/checkpoints?cursor=null HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PUT /v1/jobs/h/states/v/keys/%ff HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\n\r\n{}",
        b"POST /v1/jobs/h/fence HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 13\r\n\r\n{"epoch": []}',
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    assert [line.split(b" ")[1] for line in _raw_exchange(server.url, bad)] == [b"422", b"422", b"422", b"200"]


@pytest.fixture
def faulty_server():
    """A real uvicorn serving an app whose one route fails unexpectedly (no input of the real
    service is known to do that any more), behind the service's middleware."""
    app = FastAPI()

    @app.get("/fault")
    async def fault() -> None:
        raise RuntimeError("an unexpected fault")

    @app.get("/ok")
    async def ok() -> dict[str, bool]:
        return {"ok": True}

    app.add_middleware(MetricsMiddleware, metrics=Metrics())
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_an_unexpected_fault_is_a_500_problem_with_a_request_id_and_the_connection_stays(faulty_server):
    # Was: after any 500 uvicorn dropped the keep-alive connection unannounced (ECONNRESET).
    lines = _raw_exchange(
        faulty_server,
        [b"GET /fault HTTP/1.1\r\nHost: x\r\nX-Request-ID: trace-42\r\n\r\n", b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"],
    )
    assert [line.split(b" ")[1] for line in lines] == [b"500", b"200"]
    with httpx.Client(base_url=faulty_server) as c:
        r = c.get("/fault")
        body = problem(r, 500, "internal_error")
        assert body["request_id"] == r.headers["x-request-id"] and body["request_id"] in body["detail"]
        assert c.get("/fault", headers={"x-request-id": "trace-42"}).json()["request_id"] == "trace-42"
        assert c.get("/fault", headers={"x-request-id": "bad id\u00e9".encode()}).json()["request_id"] != "bad id"


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../../etc/passwd", "../shared/../../x", "a/../../b", "./x", "../other/x", "a//b", "a\0b"]
)
def test_snapshot_metadata_cannot_point_outside_the_snapshot(path):
    # Was: a crafted _metadata in an allowed restore location could name any file to read.
    with pytest.raises(ValueError, match="snapshot file path"):
        StreamHandle.from_dict({"path": path, "size": 1, "sha256": "00"})
    for fine in ("keyed-0.bin", "chk-3/operator.bin", "../shared/0f1e-000012.sst"):
        assert StreamHandle.from_dict({"path": fine, "size": 1, "sha256": "00"}).path == fine


def test_columnar_values_json_cannot_carry_are_refused_and_the_row_named(client):
    table = pa.table({"key": ["c0", "c1", "c2"], "value": [1.5, float("nan"), 2.5]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    r = client.post(
        "/v1/jobs/h/states/v/columns/put",
        content=sink.getvalue().to_pybytes(),
        headers={"content-type": "application/vnd.apache.arrow.stream"},
    )
    assert problem(r, 422, "invalid_value")["row"] == 1
    assert stored(client, "v", "c0") is None  # nothing of the request was applied


def nested(levels: int) -> bytes:
    """The msgpack of ``[[...[1]...]]``: ``levels`` arrays, one inside the other."""
    return b"\x91" * levels + b"\x01"


def test_a_stored_value_nested_deeper_than_an_answer_format_is_a_problem_not_a_500(tmp_path):
    """Values are depth-checked on the way in; one stored before that (an older data directory,
    a restore of an older snapshot) is written here below the HTTP layer, as such a restore
    would. JSON writes 254 levels, msgpack about 1000 and decodes 1024: beyond what a format
    carries the read is a 422 ``value_too_deep`` that says what to do, never a 500."""
    from statehouse.backends.base.partition import WriteOp
    from statehouse.backends.catalog import JobCatalog
    from statehouse.backends.rocksdb.store import RocksDBStore

    env = {"STATEHOUSE_BACKEND": "rocksdb"}
    server = start_server(tmp_path / "server", env)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            assert c.put("/v1/jobs/old", json={"max_parallelism": 128}).status_code == 201
            assert c.put("/v1/jobs/old/states/v", json={"kind": "value"}).status_code == 201
    finally:
        server.stop()
    levels = {"msgpack-only": 300, "too-deep-to-write": 1024, "too-deep-to-decode": 1100}
    catalog = JobCatalog(RocksDBStore(str(tmp_path / "server" / "data")))
    try:
        job = catalog.get("old")
        key_type = job.descriptor("v").key_type
        writes = []
        for key, depth in levels.items():
            kg, primary = job.keyspace.locate(key, key_type, "")
            writes.append(WriteOp("put", "v", kg, primary, b"", nested(depth)))
        job.partition.write(writes)
    finally:
        catalog.close()

    server = start_server(tmp_path / "server", env, port=int(server.url.rsplit(":", 1)[1]))
    try:
        with httpx.Client(base_url=server.url + "/v1/jobs/old", timeout=30) as c:
            accept_msgpack = {"accept": "application/msgpack"}
            get = {"op": "get", "state": "v", "key": "msgpack-only"}
            for r in (c.get("/states/v/keys/msgpack-only"), c.post("/batch", json={"ops": [get]})):
                assert "Accept: application/msgpack" in problem(r, 422, "value_too_deep")["detail"]
            r = c.get("/states/v/keys/msgpack-only", headers=accept_msgpack)
            assert r.status_code == 200
            value = msgpack.unpackb(r.content)["value"]
            for _ in range(levels["msgpack-only"] - 1):
                (value,) = value
            assert value == [1]
            r = c.post("/batch", content=msgpack.packb({"ops": [get]}), headers=MSGPACK)
            assert r.status_code == 200
            for key in ("too-deep-to-write", "too-deep-to-decode"):
                for headers in ({}, accept_msgpack):
                    detail = problem(c.get(f"/states/v/keys/{key}", headers=headers), 422, "value_too_deep")["detail"]
                    assert "clear or overwrite" in detail or "Accept: application/msgpack" in detail
            # What to do about it works: the value is overwritten, and reads back.
            assert c.put("/states/v/keys/too-deep-to-decode", json={"value": [[1]]}).status_code == 204
            assert c.get("/states/v/keys/too-deep-to-decode").json() == {"value": [[1]]}
        assert "Traceback" not in server.log()
    finally:
        server.stop()
