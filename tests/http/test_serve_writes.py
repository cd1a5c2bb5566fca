"""app/serve.py writes each answer's head and body with one socket write (the request floor):
over a real socket against a real server, answers still arrive whole and in order — pipelined,
on a connection the client closes, and for HEAD (a head with no body after it)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pyarrow as pa
import pytest

from tests.support.arrow_ipc import stream
from tests.support.raw_http import answer
from tests.support.server import ServerProcess, start_server

pytestmark = [pytest.mark.http]

BOUND_S = 60  # how long a test waits at most for the server: a bound, not a measurement


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("serve-writes"), {"STATEHOUSE_BACKEND": "heap"})
    yield srv
    srv.stop()


def request(method: str, path: str, body: bytes = b"", content_type: str = "", close: bool = False) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: test\r\n"
    if body or method in ("PUT", "POST"):
        head += f"content-length: {len(body)}\r\n" + (f"content-type: {content_type}\r\n" if content_type else "")
    if close:
        head += "connection: close\r\n"
    return head.encode() + b"\r\n" + body


def responses(data: bytes, methods: list[str]) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """Split what one connection received into (status, headers, body), one per request sent;
    a HEAD answer has no body whatever its Content-Length says."""
    out = []
    for method in methods:
        head, sep, data = data.partition(b"\r\n\r\n")
        assert sep, f"an answer's head is cut short: {head[:200]!r}"
        lines = head.split(b"\r\n")
        headers = dict(line.lower().split(b": ", 1) for line in lines[1:])
        length = 0 if method == "HEAD" else int(headers[b"content-length"])
        out.append((int(lines[0].split()[1]), headers, data[:length]))
        data = data[length:]
    assert data == b"", f"bytes after the last answer: {data[:200]!r}"
    return out


def exchange(server: ServerProcess, requests: list[bytes]) -> bytes:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=BOUND_S) as sock:
        sock.sendall(b"".join(requests))
        return answer(sock)


def test_pipelined_answers_arrive_whole_and_in_order(server):
    arrow = "application/vnd.apache.arrow.stream"
    put = stream(pa.table({"key": ["a", "b"], "value": [1, 2]}))
    get = stream(pa.table({"key": ["b", "a", "c"]}))
    sent = [
        request("PUT", "/v1/jobs/writes", b"{}", "application/json"),
        request("PUT", "/v1/jobs/writes/states/n", b'{"kind": "value"}', "application/json"),
        request("POST", "/v1/jobs/writes/states/n/columns/put", put, arrow),
        request("POST", "/v1/jobs/writes/states/n/columns/get", get, arrow),
        request("POST", "/v1/jobs/writes/states/n/columns/nope", get, arrow),  # refused: a problem
        request("GET", "/healthz", close=True),
    ]
    got = responses(exchange(server, sent), ["PUT", "PUT", "POST", "POST", "POST", "GET"])
    assert [status for status, _h, _b in got] == [201, 201, 200, 200, 422, 200]
    table = pa.ipc.open_stream(got[3][2]).read_all()
    assert table.column("value").to_pylist() == [2, 1, None]
    assert got[4][1][b"content-type"] == b"application/problem+json"
    assert got[5][1][b"connection"] == b"close"


def test_a_head_answer_is_its_head_alone(server):
    sent = [request("HEAD", "/healthz"), request("GET", "/healthz", close=True)]
    head, after = responses(exchange(server, sent), ["HEAD", "GET"])
    assert int(head[1][b"content-length"]) > 0 and head[2] == b""
    assert after[0] == 200 and after[2]
