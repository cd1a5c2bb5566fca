"""A small HTTP/1.1 load generator on asyncio (uvloop when installed), for 127.0.0.1 only.

Open loop: requests are released at fixed times (``rate`` per second) by a dispatcher that
never waits for responses, and each latency is measured from the request's release, so a
server stall is charged to every request that queued behind it (no coordinated omission).
Closed loop: ``connections`` workers send back-to-back. Every loop is bounded by a request count and a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

Request = Callable[[int], bytes]  # request number -> raw HTTP request bytes


@dataclass
class LoadResult:
    latencies: list[float]  # seconds
    elapsed: float
    errors: int
    released: list[float]  # perf_counter() at which each request (same order as latencies) was released

    def window(self, start: float, end: float) -> LoadResult:
        """Only the requests released in ``[start, end]``."""
        kept = [(lat, t) for lat, t in zip(self.latencies, self.released, strict=True) if start <= t <= end]
        return LoadResult([lat for lat, _t in kept], max(end - start, 1e-9), 0, [t for _lat, t in kept])

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]

    def summary(self) -> dict[str, float]:
        return {
            "requests": len(self.latencies),
            "errors": self.errors,
            "req_per_s": self.throughput,
            "p50_ms": self.percentile(50) * 1000,
            "p99_ms": self.percentile(99) * 1000,
            "p999_ms": self.percentile(99.9) * 1000,
            "mean_ms": statistics.fmean(self.latencies) * 1000 if self.latencies else float("nan"),
        }


def http_request(method: str, path: str, body: bytes = b"", content_type: str = "application/json") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n"
    if body or method in ("POST", "PUT"):
        head += f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def call(self, request: bytes) -> int:
        """Send one request, read the whole response; returns the status."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        if length:
            await self.reader.readexactly(length)
        return status


async def _connect(url: str) -> _Connection:
    parts = urlsplit(url)
    if parts.hostname != "127.0.0.1":
        raise ValueError("the load generator only talks to 127.0.0.1")
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    return _Connection(reader, writer)


async def _run(url, make: Request, count: int, rate: float | None, connections: int, timeout: float, stop):
    conns = [await _connect(url) for _ in range(connections)]
    queue: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()
    latencies: list[float] = []
    released: list[float] = []
    errors = 0
    started = time.perf_counter()
    deadline = started + timeout

    async def worker(conn: _Connection) -> None:
        nonlocal errors
        while True:
            item = await queue.get()
            if item is None:
                return
            number, intended = item
            if time.perf_counter() > deadline:
                continue  # drain without sending: the run is out of time
            intended = intended or time.perf_counter()
            status = await conn.call(make(number))
            if status >= 400:
                errors += 1
            latencies.append(time.perf_counter() - intended)
            released.append(intended)

    tasks = [asyncio.create_task(worker(c)) for c in conns]
    if rate is None:  # closed loop: every worker sends back-to-back
        for number in range(count):
            queue.put_nowait((number, 0.0))
    else:
        interval = 1.0 / rate
        for number in range(count):
            intended = started + number * interval
            delay = intended - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.perf_counter() > deadline or (stop is not None and stop()):
                break
            queue.put_nowait((number, time.perf_counter()))  # released now (timer jitter is not the server's)
    for _ in conns:
        queue.put_nowait(None)
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    for c in conns:
        c.writer.close()
        with contextlib.suppress(Exception):
            await c.writer.wait_closed()
    return LoadResult(latencies, elapsed, errors, released)


def run_load(
    url: str,
    make: Request,
    count: int,
    *,
    rate: float | None = None,
    connections: int = 8,
    timeout: float = 60,
    stop: Callable[[], bool] | None = None,
) -> LoadResult:
    """``count`` requests at ``rate``/s (open loop, ending early once ``stop()`` is true) or
    back-to-back (``rate=None``)."""
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvicorn[standard] installs it
        runner = asyncio.run
    return runner(_run(url, make, count, rate, connections, timeout, stop))
