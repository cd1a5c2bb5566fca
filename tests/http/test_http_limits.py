"""The HTTP server's own limits, over real sockets against a real server.

Before (plain uvicorn + httptools): a 300 MB request header grew RSS by 300 MB; a head sent a byte
a second was held forever; ~20,000 half-open connections used up the descriptors and every
request, /healthz too, was dropped. Now (app/serve.py): a head over STATEHOUSE_MAX_HEADER_BYTES
is refused with 431 as soon as that much is buffered; a head not complete within
STATEHOUSE_HEADER_TIMEOUT_S gets 408 and the connection is closed, a body not complete within
STATEHOUSE_BODY_TIMEOUT_S closes it; past STATEHOUSE_MAX_CONNECTIONS a connection is answered 503
``too_many_connections`` at once. Waits below are bounds, never timing assertions.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.support.process_memory import peak_growth
from tests.support.raw_http import answer
from tests.support.server import REPO, ServerProcess, free_port, start_server

pytestmark = [pytest.mark.http]

LIMITS = {
    "STATEHOUSE_BACKEND": "heap",
    "STATEHOUSE_MAX_HEADER_BYTES": str(16 << 10),
    "STATEHOUSE_HEADER_TIMEOUT_S": "2",
    "STATEHOUSE_BODY_TIMEOUT_S": "2",
    "STATEHOUSE_MAX_CONNECTIONS": "40",
}
BOUND_S = 60  # how long a test waits at most for the server to act: a bound, not a measurement
BIG_HEADER = 32 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("http-limits"), LIMITS)
    yield srv
    srv.stop()


def connect(server: ServerProcess) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=BOUND_S)


def problem(raw: bytes, status: int, code: str) -> dict:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), raw[:200]
    assert b"content-type: application/problem+json" in head.lower()
    found = orjson.loads(body)
    assert found["status"] == status and found["code"] == code and found["type"] == f"/problems/{code}"
    return found


def send_big_header(sock: socket.socket, size: int) -> None:
    """A GET whose one header is ``size`` bytes, sent until the server stops taking it."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: ")
    chunk = b"a" * (1 << 20)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        for _ in range(size // len(chunk)):
            sock.sendall(chunk)
        sock.sendall(b"\r\n\r\n")


def test_a_head_over_the_limit_is_refused_with_431(server):
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (20 << 10) + b"\r\n\r\n")
        found = problem(answer(sock), 431, "header_too_large")
    assert "STATEHOUSE_MAX_HEADER_BYTES" in found["detail"]
    # many headers, each small, count together
    headers = b"".join(b"x-h%d: %s\r\n" % (i, b"b" * 100) for i in range(300))
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + headers + b"\r\n")
        problem(answer(sock), 431, "header_too_large")
    assert httpx.get(server.url + "/healthz").status_code == 200


def test_a_huge_header_does_not_take_its_size_in_memory(server):
    with peak_growth(server.process.pid) as grown, connect(server) as sock:
        send_big_header(sock, BIG_HEADER)
        answer(sock)  # 431, or a reset: the server closed with the rest of it unread
    assert grown["peak"] < 16 << 20, grown  # was about the header's size
    assert httpx.get(server.url + "/healthz").status_code == 200


@pytest.mark.slow
def test_plain_uvicorn_took_the_header_size_in_memory(tmp_path):
    """The old behaviour, for contrast: the same header through `uvicorn statehouse.app.main:app`."""
    port = free_port()
    env = {**os.environ, "STATEHOUSE_BACKEND": "heap", "STATEHOUSE_DATA_DIR": str(tmp_path / "data")}
    command = [sys.executable, "-m", "uvicorn", "statehouse.app.main:app", "--port", str(port)]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        bare = ServerProcess(f"http://127.0.0.1:{port}", process, tmp_path / "none.log", {})
        deadline = time.monotonic() + BOUND_S
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(bare.url + "/healthz").status_code == 200:
                    break
            assert time.monotonic() < deadline, "plain uvicorn did not start"
            time.sleep(0.1)
        with peak_growth(process.pid) as grown, connect(bare) as sock:
            send_big_header(sock, BIG_HEADER)
            sock.shutdown(socket.SHUT_WR)
            answer(sock)
        assert grown["peak"] > BIG_HEADER // 2, grown
    finally:
        bare.stop()


@pytest.mark.slow
def test_a_head_sent_slowly_is_answered_408_and_closed(server):
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        deadline = time.monotonic() + BOUND_S
        sock.settimeout(0.5)
        received = b""
        while not received:
            assert time.monotonic() < deadline, "the slow head was held past the bound"
            try:
                sock.sendall(b"x")  # a byte at a time, as slowloris does
                received = sock.recv(65536)
                if not received:
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        sock.settimeout(BOUND_S)
        received += answer(sock)
    if received:  # a reset may have beaten it
        assert "STATEHOUSE_HEADER_TIMEOUT_S" in problem(received, 408, "request_timeout")["detail"]


@pytest.mark.slow
def test_a_connection_that_sends_nothing_is_closed(server):
    with connect(server) as sock:
        problem(answer(sock), 408, "request_timeout")


@pytest.mark.slow
def test_a_body_that_stops_arriving_closes_the_connection(server):
    with connect(server) as sock:
        sock.sendall(
            b"PUT /v1/jobs/slow-body HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 1000\r\n\r\n{"
        )
        assert answer(sock) == b""  # closed (nothing can be answered: the application was reading it)
    assert httpx.get(server.url + "/v1/jobs/slow-body").status_code == 404  # nothing was made


@pytest.mark.slow
def test_past_the_connection_cap_a_clear_503_and_healthz_answers_once_they_go(server):
    cap = int(LIMITS["STATEHOUSE_MAX_CONNECTIONS"])
    held = [connect(server) for _ in range(cap * 3)]  # half-open: they never send a byte
    try:
        # Those past the cap were answered at once and closed: their descriptors are free again.
        for sock in held[cap + 5 :]:
            found = problem(answer(sock), 503, "too_many_connections")
        assert "STATEHOUSE_MAX_CONNECTIONS" in found["detail"]
        assert len(os.listdir(f"/proc/{server.process.pid}/fd")) < cap + 100
        # /healthz meanwhile: answered, or refused clearly; never dropped silently
        probe = httpx.get(server.url + "/healthz")
        assert probe.status_code == 200 or probe.json()["code"] == "too_many_connections"
        # the held ones time out (408), and /healthz answers again
        for sock in held[: cap - 5]:
            problem(answer(sock), 408, "request_timeout")
        deadline = time.monotonic() + BOUND_S
        while httpx.get(server.url + "/healthz").status_code != 200:
            assert time.monotonic() < deadline, "/healthz stayed refused after the held connections timed out"
            time.sleep(0.2)
    finally:
        for sock in held:
            sock.close()


def test_no_refusal_above_left_a_fault_in_the_log(server):
    """Runs last: every refusal above was an answer, not an error of the server."""
    log = server.log()
    assert "Traceback" not in log and "Invalid HTTP request" not in log, log[-3000:]
