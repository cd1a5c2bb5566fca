"""The client's retry policy (urllib3's Retry) against a real HTTP server that answers as scripted:
502-504 and transport errors are retried only for requests that are safe to repeat."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from statehouse.client import InvalidRequest, StatehouseError, Unavailable
from statehouse.client.transport import ReplicaConnection

PROBLEM = {"code": "not_ready", "status": 503, "detail": "the replica is starting"}


class ScriptedServer(ThreadingHTTPServer):
    """Answers each request with the next status of ``script`` (then 200 with ``{"ok": true}``)
    and records what it was sent."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: list[int] = []
        self.seen: list[tuple[str, str, bytes]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedServer

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.seen.append((self.command, self.path, body))
        status = self.server.script.pop(0) if self.server.script else 200
        payload = json.dumps(PROBLEM if status >= 400 else {"ok": True}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/problem+json" if status >= 400 else "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    scripted = ScriptedServer()
    thread = threading.Thread(target=scripted.serve_forever, daemon=True)
    thread.start()
    yield scripted
    scripted.shutdown()
    scripted.server_close()


def connection(server: ScriptedServer, retries: int = 3) -> ReplicaConnection:
    return ReplicaConnection(server.url, retries=retries, backoff=0.001, timeout=5)


def test_a_safe_request_is_retried_through_502_to_504(server):
    server.script = [503, 502, 504]
    assert connection(server).json("GET", "/v1/jobs/j") == {"ok": True}
    assert [seen[:2] for seen in server.seen] == [("GET", "/v1/jobs/j")] * 4


def test_retries_run_out_into_the_last_answer_as_an_error(server):
    server.script = [503] * 10
    with pytest.raises(Unavailable, match="the replica is starting") as raised:
        connection(server, retries=2).json("GET", "/v1/jobs/j")
    assert raised.value.status == 503 and raised.value.code == "not_ready"
    assert len(server.seen) == 3  # the request and two retries


def test_a_request_that_is_not_safe_to_repeat_is_sent_once(server):
    server.script = [503]
    with pytest.raises(Unavailable):
        add = {"op": "add", "state": "s", "key": "k", "value": 1}
        connection(server).batch("j", [add], fields={}, idempotent=False)
    assert len(server.seen) == 1


def test_other_errors_are_not_retried(server):
    server.script = [500, 422]
    with pytest.raises(StatehouseError) as raised:
        connection(server).json("GET", "/v1/jobs/j")
    assert raised.value.status == 500 and len(server.seen) == 1
    with pytest.raises(InvalidRequest):
        connection(server).json("GET", "/v1/jobs/j")
    assert len(server.seen) == 2


def test_a_columnar_request_is_re_sent_whole(server):
    server.script = [503]
    body = b"arrow stream bytes"
    content = connection(server).columns("j", "s", "put", memoryview(body), params={"epoch": 3}, idempotent=True)
    assert json.loads(content) == {"ok": True}
    assert server.seen == [("POST", "/v1/jobs/j/states/s/columns/put?epoch=3", body)] * 2


def test_json_bodies_and_query_parameters(server):
    connection(server).request("PUT", "/v1/x", idempotent=True, json={"value": [1, "é"]}, params={"mode": "union"})
    method, path, body = server.seen[0]
    assert (method, path, json.loads(body)) == ("PUT", "/v1/x?mode=union", {"value": [1, "é"]})
