"""The client's retry policy (urllib3's Retry) against a real HTTP server that answers as scripted:
502-504 and transport errors are retried only for requests that are safe to repeat."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from statehouse.client import InvalidRequest, StatehouseError, Unavailable, transport
from statehouse.client.transport import ReplicaConnection

pytestmark = [pytest.mark.http]

PROBLEM = {"code": "not_ready", "status": 503, "detail": "the replica is starting"}
DROP = "drop"


class ScriptedServer(ThreadingHTTPServer):
    """Answers each request as the next item of ``script`` says (then 200 with ``{"ok": true}``)
    and records what it was sent. An item is a status, a status with headers (and a problem
    body instead of PROBLEM), or ``DROP``: the request read, the connection closed without an answer."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: list[Any] = []
        self.seen: list[tuple[str, str, bytes]] = []
        self.headers_seen: list[dict[str, str]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedServer

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.seen.append((self.command, self.path, body))
        self.server.headers_seen.append(dict(self.headers))
        item = self.server.script.pop(0) if self.server.script else 200
        if item == DROP:
            self.close_connection = True
            return
        status, extra, problem = (*item, PROBLEM)[:3] if isinstance(item, tuple) else (item, {}, PROBLEM)
        payload = json.dumps(problem if status >= 400 else {"ok": True}).encode()
        self.send_response(status)
        for name, value in extra.items():
            self.send_header(name, value)
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
    # A short poll: shutdown() waits for serve_forever's next look, 0.5 s by default.
    thread = threading.Thread(target=scripted.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
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


def test_a_dropped_connection_is_retried_only_when_safe(server):
    server.script = [DROP, DROP]
    assert connection(server).json("GET", "/v1/jobs/j") == {"ok": True}
    assert len(server.seen) == 3
    server.script = [DROP]
    add = {"op": "add", "state": "s", "key": "k", "value": 1}
    with pytest.raises(Unavailable, match="unreachable"):
        connection(server).batch("j", [add], fields={}, idempotent=False)  # it may have been applied
    assert len(server.seen) == 4


def test_retry_after_is_not_obeyed(server):
    # urllib3 would retry a 429 that carries it, after waiting as long as it says.
    server.script = [(429, {"retry-after": "1"})]
    with pytest.raises(StatehouseError) as raised:
        connection(server).json("GET", "/v1/jobs/j")
    assert raised.value.status == 429 and len(server.seen) == 1


def test_json_calls_send_the_token_and_refuse_what_json_cannot_say(server):
    token = ReplicaConnection(server.url, token="s3cret", retries=0)
    token.request("PUT", "/v1/x", idempotent=True, json={"a": 1}, headers={"x-extra": "1"})
    sent = {k.lower(): v for k, v in server.headers_seen[0].items()}
    assert sent["authorization"] == "Bearer s3cret" and sent["content-type"] == "application/json"
    assert sent["x-extra"] == "1"
    with pytest.raises(ValueError):
        token.request("PUT", "/v1/x", idempotent=True, json={"value": float("nan")})
    assert len(server.seen) == 1  # refused before sending


MOVING = {"code": "rescale_in_progress", "status": 503, "detail": "key group 3 is being moved", "topology_version": 2}


def test_a_write_refused_by_a_live_rescale_is_retried_as_retry_after_says(server):
    # Not idempotent, yet retried: the refusal applied nothing. By this loop, not urllib3's (which
    # would spend its three retries at once): each refusal is one request.
    server.script = [(503, {"retry-after": "0.1"}, MOVING)] * 2
    assert connection(server, retries=0).json("POST", "/v1/jobs/j/batch", {"ops": []}, idempotent=False) == {"ok": True}
    assert len(server.seen) == 3


def test_the_problems_retry_after_ms_sets_the_pace_finer_than_the_header(server, monkeypatch):
    """A freeze lasts about a second: retried every ``retry_after_ms``, not every whole second; past
    5 s of refusals (a move left frozen), every ``Retry-After``, so waiting writers do not flood it."""
    clock, waits = [0.0], []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock[0] += seconds

    # The transport's clock only: urllib3 reads the real one for its timeouts (a shared fake
    # clock that jumps by the waits can leave a request's read timeout at 0).
    monkeypatch.setattr(transport, "time", SimpleNamespace(monotonic=lambda: clock[0], sleep=sleep))
    server.script = [(503, {"retry-after": "1"}, MOVING | {"retry_after_ms": 200})] * 28
    assert connection(server, retries=0).json("POST", "/v1/jobs/j/batch", {"ops": []}, idempotent=False) == {"ok": True}
    assert waits == [0.2] * 25 + [1.0] * 3 and len(server.seen) == 29


def test_a_retry_after_ms_that_is_not_a_number_leaves_the_header(server, monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(transport, "time", SimpleNamespace(monotonic=time.monotonic, sleep=waits.append))
    server.script = [(503, {"retry-after": "1"}, MOVING | {"retry_after_ms": "soon"})]
    assert connection(server, retries=0).json("POST", "/v1/jobs/j/batch", {"ops": []}, idempotent=False) == {"ok": True}
    assert waits == [1.0]


def test_a_live_rescale_that_does_not_end_is_waited_for_boundedly(server):
    server.script = [(503, {"retry-after": "0.1"}, MOVING)] * 100
    bounded = ReplicaConnection(server.url, retries=3, backoff=0.001, timeout=5, rescale_wait=0.35)
    with pytest.raises(Unavailable, match="still refused after 0s of retries: finish or abort the rescale") as raised:
        bounded.json("POST", "/v1/jobs/j/batch", {"ops": []})
    assert raised.value.code == "rescale_in_progress" and 3 <= len(server.seen) <= 5
