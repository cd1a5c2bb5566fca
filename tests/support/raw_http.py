"""HTTP/1.1 over a bare socket: what a server answers to requests no HTTP client would send
(a head without its body, a header of megabytes)."""

from __future__ import annotations

import contextlib
import socket

HUGE = 64 << 20  # STATEHOUSE_MAX_BODY_BYTES' default: a body the server would otherwise read whole


def answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or resets it)."""
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def status_before_the_body(url: str, method: str, path: str, headers: dict[str, str], length: int = HUGE) -> int:
    """Send a request's head announcing a body of ``length`` bytes (64 MiB: as large as may be),
    and none of the body, to the server at ``url``: the status it answers with. A server that read
    the body first would never answer (the socket's timeout fails the test instead)."""
    host, port = url.removeprefix("http://").split(":")
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode("latin-1"))
        received = b""
        while b"\r\n" not in received:
            chunk = sock.recv(4096)
            assert chunk, "the server closed the connection without an answer"
            received += chunk
    return int(received.split(b" ")[1])
