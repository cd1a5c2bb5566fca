"""A fault-injecting TCP proxy for tests: slow and lossy links without netem (dev only).

It listens on a free local port and forwards every connection to one target (a Statehouse
replica, SeaweedFS), each direction by its own thread. Faults are set at any time and apply from
then on, to the connections that exist and to new ones:

- ``delay`` (and ``jitter``): every chunk forwarded waits ``delay`` seconds, plus up to ``jitter``
  more at random, in either direction (a slow link);
- ``rate``: each direction of each connection carries at most ``rate`` bytes a second (a narrow
  link: a large upload or download takes its size over ``rate``);
- ``stall`` (with ``stall_s``): a chunk is held ``stall_s`` seconds with probability ``stall``, the
  connection otherwise intact (what packet loss does to TCP: a retransmission timeout, nothing lost);
- ``cut``: with probability ``cut`` a chunk is not forwarded and its connection is reset instead (a
  link that breaks in the middle of a transfer: the peer sees a reset, part of a body sent);
- ``drop``: bytes are read and thrown away, both ways, the connections kept open (a link that
  silently loses everything: the peer sees nothing until its own timeout);
- ``reset``: every connection is reset (RST) at once, and new ones as they arrive;
- ``half_open``: the server's answers are thrown away, the requests still forwarded (the peer
  waits for an answer that never comes, while the server acts);
- :meth:`FaultyProxy.swallow`: the answer to the next ``count`` requests whose request line holds
  ``match`` is thrown away once the server sent it, and the connection reset: the server acted,
  the client never learns how (a response lost after the request reached the server).

``proxy.counts`` tallies connections, resets (``cuts`` among them), stalls and swallowed answers,
for a test to check that its faults happened. Use it as a context manager, or ``start()`` / ``stop()``.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit


@dataclass
class Faults:
    """What the proxy does to the bytes it forwards (see the module's docstring)."""

    delay: float = 0.0
    jitter: float = 0.0
    rate: float = 0.0  # bytes a second per direction of a connection; 0: unlimited
    stall: float = 0.0  # probability that a chunk is held stall_s seconds
    stall_s: float = 1.0
    cut: float = 0.0  # probability that a chunk resets its connection instead of being forwarded
    drop: bool = False
    reset: bool = False
    half_open: bool = False


@dataclass
class _Swallow:
    match: bytes
    count: int


class _Link:
    """One client connection and its connection to the target."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.swallow_next = 0  # answers to throw away: requests a swallow rule matched
        self.closed = threading.Event()

    def reset(self) -> None:
        """Close both sockets with an RST (SO_LINGER 0), not a FIN: the peer sees a reset connection."""
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # The other direction's thread is blocked reading this socket, and the kernel keeps a
            # socket open while a read is in progress: without waking that read (SHUT_RD sends
            # nothing), close() would not reset the connection and the peer would wait for its timeout.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RD)
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class FaultyProxy:
    """A TCP proxy to ``target`` (``http://host:port`` or ``(host, port)``) that injects faults;
    ``url`` is where clients connect (the target's scheme, the proxy's port)."""

    def __init__(self, target: str | tuple[str, int], *, seed: int = 0) -> None:
        if isinstance(target, str):
            parts = urlsplit(target)
            assert parts.hostname is not None and parts.port is not None, target
            self.target, self._scheme = (parts.hostname, parts.port), parts.scheme or "http"
        else:
            self.target, self._scheme = target, "http"
        self.faults = Faults()
        self.counts: Counter[str] = Counter()
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._swallows: list[_Swallow] = []
        self._links: set[_Link] = set()
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()
        self.port = 0

    @property
    def url(self) -> str:
        return f"{self._scheme}://127.0.0.1:{self.port}"

    # -- faults -------------------------------------------------------------------------------

    def set(self, **faults: float | bool) -> None:
        """Replace the faults (``proxy.set()`` clears them); ``reset=True`` resets every connection now."""
        self.faults = Faults(**faults)  # type: ignore[arg-type]
        if self.faults.reset:
            with self._lock:
                links = list(self._links)
            for link in links:
                self._reset(link)

    @contextlib.contextmanager
    def faulty(self, **faults: float | bool):
        """The faults for the ``with`` block, none after it."""
        self.set(**faults)
        try:
            yield self
        finally:
            self.set()

    def swallow(self, match: bytes | str, count: int = 1) -> None:
        """Throw away the answers to the next ``count`` requests whose request line holds ``match``
        (``b"POST /v1/jobs/j/batch"``), each after the server sent it, and reset the connection."""
        with self._lock:
            self._swallows.append(_Swallow(match.encode() if isinstance(match, str) else match, count))

    def swallows_pending(self) -> int:
        with self._lock:
            return sum(s.count for s in self._swallows)

    # -- running ------------------------------------------------------------------------------

    def start(self) -> FaultyProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.settimeout(0.2)
        self._listener, self.port = listener, listener.getsockname()[1]
        threading.Thread(target=self._accept, name=f"faulty-proxy-{self.port}", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()

    def __enter__(self) -> FaultyProxy:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                client, _address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.counts["connections"] += 1
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                self.counts["target_refused"] += 1
                _Link(client, socket.socket()).reset()  # as the target would: refused
                continue
            for sock in (client, server):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, server)
            if self.faults.reset:
                self._reset(link)
                continue
            with self._lock:
                self._links.add(link)
            threading.Thread(target=self._pump, args=(link, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(link, False), daemon=True).start()

    def _reset(self, link: _Link) -> None:
        if not link.closed.is_set():
            self.counts["resets"] += 1
        link.reset()
        with self._lock:
            self._links.discard(link)

    def _matched(self, data: bytes) -> bool:
        """Whether a request starting in ``data`` is one a swallow rule takes (the rule counted down)."""
        with self._lock:
            for rule in self._swallows:
                if rule.count > 0 and rule.match in data:
                    rule.count -= 1
                    self._swallows = [s for s in self._swallows if s.count > 0]
                    return True
        return False

    def _pump(self, link: _Link, upstream: bool) -> None:
        """Forward one direction of ``link`` (``upstream``: client to server) until either side closes."""
        source, sink = (link.client, link.server) if upstream else (link.server, link.client)
        try:
            while not link.closed.is_set():
                data = source.recv(65536)
                if not data:
                    break
                faults = self.faults
                if faults.delay or faults.jitter:
                    time.sleep(faults.delay + self._random.random() * faults.jitter)
                if faults.rate:
                    time.sleep(len(data) / faults.rate)
                if faults.stall and self._random.random() < faults.stall:
                    self.counts["stalls"] += 1
                    time.sleep(faults.stall_s)
                if faults.cut and self._random.random() < faults.cut:
                    self.counts["cuts"] += 1
                    self._reset(link)
                    return
                if faults.reset:
                    self._reset(link)
                    return
                if faults.drop or (faults.half_open and not upstream):
                    continue
                if upstream:
                    if self._matched(data):
                        link.swallow_next += 1
                elif link.swallow_next:
                    # The server answered: the answer is lost, and the connection with it.
                    link.swallow_next -= 1
                    self.counts["swallowed"] += 1
                    self._reset(link)
                    return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            # One side ended: end the other (a FIN, unless the link was reset).
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
            if not upstream or link.closed.is_set():
                link.close()
                with self._lock:
                    self._links.discard(link)
