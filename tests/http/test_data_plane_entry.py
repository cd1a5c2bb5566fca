"""The columnar routes' entry beside ASGI (``app/data_plane.py``, taken by ``python -m
statehouse.app.serve``) answers as the app answers through ASGI (plain ``uvicorn
statehouse.app.main:app``): the same requests, byte for byte over a bare socket, get the same
statuses, headers and bodies from both, refusals and pipelining included; and it keeps the
server's HTTP behaviour (``Expect: 100-continue``, ``Connection: close``, HTTP/1.0) and counts
in ``/metrics`` as a routed request does."""

from __future__ import annotations

import asyncio
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from starlette.requests import Request
from uvicorn.server import ServerState

from statehouse.app import serve
from statehouse.app.data_plane import DataPlane
from statehouse.app.main import create_app
from statehouse.app.settings import load_settings
from tests.support.arrow_ipc import ARROW, stream
from tests.support.raw_http import answer
from tests.support.server import ModuleCommand, ServerProcess, await_ready, free_port, launch_server, run_module

pytestmark = [pytest.mark.http]

JSON = "application/json"
ADMIN, SCOPED, OTHER = "t-admin", "t-scoped", "t-other"
ENV = {
    "STATEHOUSE_BACKEND": "heap",
    "STATEHOUSE_API_TOKENS": f"{ADMIN}:*+@admin,{SCOPED}:door,{OTHER}:elsewhere",
    "STATEHOUSE_MAX_BODY_BYTES": "65536",
}
BOUND_S = 60  # how long a test waits at most for a server: a bound, not a measurement


def _plain_uvicorn(workdir: Path) -> ServerProcess:
    """The app under plain uvicorn (every request through ASGI), settings as ``launch_server``'s."""
    workdir.mkdir(parents=True)
    port = free_port()
    env = {
        **os.environ,
        "STATEHOUSE_DATA_DIR": str(workdir / "data"),
        "STATEHOUSE_CHECKPOINT_DIR": str(workdir / "checkpoints"),
        **ENV,
    }
    log = workdir / "uvicorn.log"
    argv = ["statehouse.app.main:app", "--host", "127.0.0.1", "--port", str(port)]
    process = run_module(ModuleCommand("uvicorn", argv, env, log))
    settings = {k: v for k, v in env.items() if k.startswith("STATEHOUSE_")}
    return await_ready(ServerProcess(f"http://127.0.0.1:{port}", process, log, settings))


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, ServerProcess]]:
    root = tmp_path_factory.mktemp("data-plane-entry")
    started = {"serve": await_ready(launch_server(root / "serve", ENV)), "asgi": _plain_uvicorn(root / "asgi")}
    for server in started.values():
        _setup(server)
    yield started
    for server in started.values():
        server.stop()


def request(
    method: str, path: str, body: bytes = b"", token: str | None = ADMIN, content_type: str = ARROW, **headers: str
) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: test\r\n"
    if token:
        head += f"authorization: Bearer {token}\r\n"
    if method in ("PUT", "POST"):
        head += f"content-type: {content_type}\r\n"
        if "transfer_encoding" not in headers:
            head += f"content-length: {len(body)}\r\n"
    head += "".join(f"{name.replace('_', '-')}: {value}\r\n" for name, value in headers.items())
    return head.encode() + b"\r\n" + body


def chunked(path: str, size: int) -> bytes:
    """A columnar put whose body comes in chunks, ``size`` bytes in all (no Content-Length)."""
    head = request("POST", path, transfer_encoding="chunked")
    piece = b"x" * 4096
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(size // len(piece)))
    return head + chunks + b"0\r\n\r\n"


def split(data: bytes) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    """What one connection received, as (status line, headers, body) per answer; interim answers
    (``100 Continue``) included."""
    out = []
    while data:
        head, sep, data = data.partition(b"\r\n\r\n")
        assert sep, f"an answer's head is cut short: {head[:200]!r}"
        lines = head.split(b"\r\n")
        headers = {name.lower(): value for name, value in (line.split(b": ", 1) for line in lines[1:])}
        length = int(headers.get(b"content-length", b"0"))
        out.append((lines[0], headers, data[:length]))
        data = data[length:]
    return out


def exchange(server: ServerProcess, requests: list[bytes], then_close: bool = True) -> bytes:
    """Send ``requests`` in one write on a new connection; everything answered until the server
    closes it (the last request asks it to, unless ``then_close`` is false: then until it is idle)."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=BOUND_S) as sock:
        sent = b"".join(requests)
        if then_close:
            sent += request("GET", "/healthz", token=None, connection="close")
        sock.sendall(sent)
        return answer(sock)


def comparable(data: bytes) -> list[tuple[bytes, dict[bytes, bytes], object]]:
    """Answers with what differs between two servers taken out (date, server; the X-Request-ID a
    server makes up), Arrow bodies as tables."""
    out: list[tuple[bytes, dict[bytes, bytes], object]] = []
    for status, headers, body in split(data):
        headers = {k: v for k, v in headers.items() if k not in (b"date", b"server")}
        content: object = body
        if headers.get(b"content-type") == ARROW.encode():
            content = pa.ipc.open_stream(body).read_all().to_pydict()
        out.append((status, headers, content))
    return out


def _setup(server: ServerProcess) -> None:
    sent = [
        request("PUT", "/v1/jobs/door", b"{}", content_type="application/json"),
        request("PUT", "/v1/jobs/door/states/n", b'{"kind": "value"}', content_type="application/json"),
        request("PUT", "/v1/jobs/door/states/m", b'{"kind": "value"}', content_type="application/json"),
    ]
    assert [s for s, _h, _b in split(exchange(server, sent))][:3] == [b"HTTP/1.1 201 Created"] * 3


def test_the_entry_answers_as_the_app_does_through_asgi(servers):
    put = stream(pa.table({"key": ["a", "b"], "value": [1, 2]}))
    get = stream(pa.table({"key": ["b", "a", "c"]}))
    both = stream(pa.table({"key": ["a", "z"], "value:n": [5, 6], "value:m": [7, 8]}))
    timers = stream(pa.table({"key": ["a", "b"], "timestamp": pa.array([10, 20], pa.int64())}))
    states = "/v1/jobs/door/columns"
    one = "/v1/jobs/door/states/n/columns"
    sent = [
        request("POST", f"{one}/put", put),
        request("POST", f"{one}/get", get, token=SCOPED),
        request("POST", f"{states}/put?states=n,m", both),
        request("POST", f"{states}/get?states=m,n", get),
        request("POST", f"{one}/put?partition=0&attempt=task-1&seq=0", put),  # 409: an attempt's write needs the epoch
        request("POST", f"{one}/put?epoch=nope", put),  # 422: the query
        request("POST", f"{one}/put", put, token=None),  # 401, WWW-Authenticate
        request("POST", f"{one}/put", put, token=OTHER),  # 403
        request("POST", f"{one}/put", put, token="wrong"),  # 401
        request("POST", f"{one}/put", b"{}", content_type="application/json"),  # 415
        request("POST", f"{one}/put", b"not arrow"),  # 400 malformed
        request("POST", f"{one}/nope", put),  # 422: not a columnar op, the app's router answers
        request("POST", "/v1/jobs/none/states/n/columns/get", get),  # 404 job
        request("POST", "/v1/jobs/door/states/none/columns/get", get),  # 404 state
        request("POST", f"{states}/get", get),  # 422: no states named
        request("POST", "/v1/jobs/door/states/n%ff/columns/get", get),  # 422: not UTF-8
        request("POST", f"{one}/get", stream(pa.table({"key": ["a"] * 10}))),
        request(
            "POST", "/v1/jobs/door/batch", b'{"ops": [{"op": "get", "state": "n", "key": "a"}]}', content_type=JSON
        ),
        request(
            "POST",
            "/v1/jobs/door/batch",
            b'{"ops": [{"op": "put", "state": "n", "key": "q", "value": 9}]}',
            content_type=JSON,
        ),
        request("POST", "/v1/jobs/door/batch", b"[1, 2", content_type=JSON),  # 400 malformed
        request("POST", "/v1/jobs/door/batch", b'{"ops": 1}', content_type=JSON),  # 422
        request(
            "POST",
            "/v1/jobs/door/batch",
            b'{"ops": [{"op": "get", "state": "n", "key": "a"}]}',
            token=OTHER,
            content_type=JSON,
        ),  # 403
        request("POST", "/v1/jobs/door/timers/event/columns/register", timers),
        request("POST", "/v1/jobs/door/timers/event/columns/delete?key_type=string", timers),
        request(
            "POST", "/v1/jobs/door/timers/event/columns/register?key_type=int", timers
        ),  # 422: the keys are not ints
        request("POST", "/v1/jobs/door/timers/event/columns/register?key_type=nope", timers),  # FastAPI's 422
        request("POST", "/v1/jobs/door/timers/never/columns/register", timers),  # FastAPI's 422
        request("POST", "/v1/jobs/door/timers/processing/columns/nope", timers),  # FastAPI's 422
    ]
    got = {door: comparable(exchange(server, sent)) for door, server in servers.items()}
    assert got["serve"] == got["asgi"]
    statuses = [int(status.split()[1]) for status, _h, _b in got["serve"]]
    columns = [200, 200, 200, 200, 409, 422, 401, 403, 401, 415, 400, 422, 404, 404, 422, 422, 200]
    assert statuses == [*columns, 200, 200, 400, 422, 403, 200, 200, 422, 422, 422, 422, 200]
    assert got["serve"][1][2] == {"key": ["b", "a", "c"], "value": [2, 1, None]}
    assert got["serve"][3][2] == {"key": ["b", "a", "c"], "value:m": [None, 7, None], "value:n": [2, 5, None]}
    assert got["serve"][6][1][b"www-authenticate"] == b"Bearer"


def test_a_body_over_the_limit_is_refused_before_it_is_read(servers):
    path = "/v1/jobs/door/states/n/columns/put"
    # Declared too large: answered from the head alone (the body never sent), then closed by us.
    head_only = request("POST", path, b"", **{"content_length": "70000"}).replace(b"content-length: 0\r\n", b"")
    got = {door: comparable(exchange(server, [head_only], then_close=False)) for door, server in servers.items()}
    assert got["serve"] == got["asgi"]
    assert got["serve"][0][0] == b"HTTP/1.1 413 Request Entity Too Large"
    # Chunked, no length declared: counted as it arrives.
    got = {door: comparable(exchange(server, [chunked(path, 80 * 1024)])) for door, server in servers.items()}
    assert got["serve"] == got["asgi"]
    assert [status for status, _h, _b in got["serve"]] == [b"HTTP/1.1 413 Request Entity Too Large", b"HTTP/1.1 200 OK"]


def test_expect_continue_connection_close_and_http_1_0(servers):
    server = servers["serve"]
    put = stream(pa.table({"key": ["c"], "value": [3]}))
    path = "/v1/jobs/door/states/n/columns/put"
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=BOUND_S) as sock:
        head, _sep, body = request("POST", path, put, expect="100-continue").partition(b"\r\n\r\n")
        sock.sendall(head + b"\r\n\r\n")  # the head alone: the body once the server asks for it
        interim = sock.recv(4096)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body + request("POST", path, put, connection="close"))
        answers = split(answer(sock))  # the server closes the connection after the second
    assert [status for status, _h, _b in answers] == [b"HTTP/1.1 200 OK"] * 2
    assert answers[1][1][b"connection"] == b"close"
    old = request("POST", path, put).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
    answers = split(exchange(server, [old], then_close=False))  # HTTP/1.0: closed after the answer
    assert [status for status, _h, _b in answers] == [b"HTTP/1.1 200 OK"]
    assert answers[0][1][b"connection"] == b"close"


def test_the_entrys_requests_count_in_metrics_by_route(servers):
    path = "/v1/jobs/door/states/n/columns/put"
    put = stream(pa.table({"key": ["d"], "value": [4]}))
    counted = re.compile(
        rb'statehouse_http_requests_total\{method="POST",route="/v1/jobs/\{job\}/states/\{state\}/columns/\{op\}",'
        rb'status="200"\} (\S+)'
    )

    def count(server: ServerProcess) -> float:
        _status, _headers, text = split(exchange(server, [request("GET", "/metrics")]))[0]
        found = counted.search(text)
        return float(found[1]) if found else 0.0

    added = {}
    for door, server in servers.items():
        before = count(server)
        exchange(server, [request("POST", path, put)] * 3)
        added[door] = count(server) - before
    assert added == {"serve": 3.0, "asgi": 3.0}


def test_a_fault_is_a_500_that_names_a_request_id(monkeypatch, tmp_path):
    """Nothing a client sends makes the columnar route fail unexpectedly: a fault is put in its place."""
    monkeypatch.setenv("STATEHOUSE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("STATEHOUSE_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    app = create_app(load_settings())
    plane = app.data_plane
    assert isinstance(plane, DataPlane)

    async def fault(*_args: object) -> None:
        raise RuntimeError("a fault")

    monkeypatch.setattr(plane.routes, "respond", fault)
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/jobs/j/states/s/columns/put",
        "raw_path": b"/v1/jobs/j/states/s/columns/put",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"x-request-id", b"req-42"), (b"content-type", ARROW.encode()), (b"content-length", b"0")],
        "server": ("test", 80),
    }

    async def run() -> object:
        async with app.router.lifespan_context(app):
            found = plane.route(scope)
            assert found is not None
            return await plane.answer(scope, Request(scope).receive, found)

    response = asyncio.run(run())
    assert response.status_code == 500
    assert response.headers["x-request-id"] == "req-42"
    assert b'"code":"internal_error"' in response.body and b"req-42" in response.body


def test_the_servers_protocol_takes_the_columnar_routes_and_nothing_else(monkeypatch, tmp_path):
    """What the comparison above relies on: under ``python -m statehouse.app.serve`` the protocol
    finds the app's data plane (under uvicorn's wrappers), and it takes the columnar routes only."""
    monkeypatch.setenv("STATEHOUSE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("STATEHOUSE_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    settings = load_settings()
    loop = asyncio.new_event_loop()
    config = serve.config(settings, "127.0.0.1", free_port())
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    plane = protocol.data_plane
    assert isinstance(plane, DataPlane)

    def taken(method: str, path: str) -> bool:
        return plane.route({"type": "http", "method": method, "path": path, "root_path": ""}) is not None

    assert taken("POST", "/v1/jobs/j/states/s/columns/put") and taken("POST", "/v1/jobs/j/columns/get")
    assert not taken("POST", "/v1/jobs/j/states/s/columns/nope")  # FastAPI's 422, through ASGI
    assert not taken("GET", "/v1/jobs/j/states/s/columns/get")
    assert taken("POST", "/v1/jobs/j/batch") and taken("POST", "/v1/jobs/j/timers/event/columns/register")
    assert not taken("POST", "/v1/jobs/j/timers/event/columns/nope")
    # Another app (the bench's bare one) has none: every request goes through ASGI.
    bare = serve.config(settings, "127.0.0.1", free_port(), app="bench.bare_asgi:app")
    bare.load()
    assert (
        bare.http_protocol_class(config=bare, server_state=ServerState(), app_state={}, _loop=loop).data_plane is None
    )
    loop.close()


def test_a_refused_requests_access_line_names_the_client_as_uvicorn_does(servers):
    """Refusals are logged (successes are not, by default); behind a trusted proxy the line names
    the client ``X-Forwarded-For`` gives, as uvicorn's proxy-header layer, which the entry skips,
    would have it."""
    path = "/v1/jobs/door/states/n/columns/put"
    refused = request(
        "POST", path, stream(pa.table({"key": ["e"], "value": [5]})), token=None, x_forwarded_for="203.0.113.7"
    )
    lines = {}
    for door, server in servers.items():
        exchange(server, [refused])
        lines[door] = [line for line in server.log().splitlines() if "203.0.113.7" in line and path in line]
    assert [line.split("INFO:")[-1].strip() for line in lines["serve"]] == [
        line.split("INFO:")[-1].strip() for line in lines["asgi"]
    ]
    assert len(lines["serve"]) == 1 and '" 401' in lines["serve"][0], lines
