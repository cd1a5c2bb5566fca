"""``python -m statehouse.app.serve``: how the server is started everywhere (``make run``, the image,
the Helm chart, the tests' harness), so that its HTTP limits apply everywhere.

uvicorn with httptools (its ``[standard]`` set, on uvloop) bounds none of these, measured against
uvicorn 0.54: a request head is buffered whatever its size (a 300 MB header took 300 MB of RSS);
a head sent a byte a second is waited for forever (the keep-alive timeout runs only between
requests); and every connection is accepted until the process runs out of file descriptors
(~20,000 half-open ones, and then every request, /healthz too, was dropped). ``--limit-concurrency``
answers 503 only to requests whose head has arrived; ``h11_max_incomplete_event_size`` exists for
the slower h11 parser only. So :class:`GuardedHttpToolsProtocol` adds, per connection, what an
HTTP server needs (bench/RESULTS.md §12 measures its cost: within the run-to-run noise):

* a request head (request line and headers) over ``STATEHOUSE_MAX_HEADER_BYTES`` is answered
  431 ``header_too_large`` and the connection closed, as soon as that many bytes are buffered;
* a head that has not fully arrived ``STATEHOUSE_HEADER_TIMEOUT_S`` after the connection opened
  (or after its first byte, on a kept-alive connection) is answered 408 ``request_timeout``;
  a body not complete ``STATEHOUSE_BODY_TIMEOUT_S`` after its head ends the connection;
* a connection past ``STATEHOUSE_MAX_CONNECTIONS`` open at once is answered 503
  ``too_many_connections`` at once and closed (a clear refusal, and its descriptor is freed).

Answers are problem+json, as the application's own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import copy
import functools
from typing import TYPE_CHECKING, Any, ClassVar, cast

import orjson
import uvicorn
from starlette.types import Receive, Scope
from uvicorn.config import LOGGING_CONFIG
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from statehouse.app import access_log
from statehouse.app.data_plane import DataPlane, Found
from statehouse.app.problems import STATUS_BY_CODE, problem_type
from statehouse.app.settings import Settings, load_settings

if TYPE_CHECKING:  # uvicorn's scope type, for the checker only (a private module)
    from uvicorn._types import HTTPScope

APP = "statehouse.app.main:app"
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


def _refusal(code: str, detail: str, docs_url: str) -> bytes:
    """A whole HTTP/1.1 response: the problem, and ``Connection: close``."""
    status = STATUS_BY_CODE[code]
    body = orjson.dumps(
        {"type": problem_type(code, docs_url), "title": _REASONS[status].decode(), "status": status, "code": code}
        | {"detail": detail}
    )
    head = (
        f"HTTP/1.1 {status} ".encode()
        + _REASONS[status]
        + b"\r\ncontent-type: application/problem+json\r\nconnection: close\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
    )
    return head + body


class _HeldHead(asyncio.Transport):
    """Stands in for the transport while uvicorn writes a response's head: keeps the bytes
    (``write`` is all of a transport that uvicorn uses then)."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        super().__init__()
        self.data = b""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.data += data


class _HeadFirst(asyncio.Transport):
    """Stands in for the transport while uvicorn writes a response's first body part: the held
    head goes out in the same write (``write`` and ``close`` are all of a transport that uvicorn
    uses then)."""

    __slots__ = ("head", "transport")

    def __init__(self, transport: asyncio.Transport, head: bytes) -> None:
        super().__init__()
        self.transport, self.head = transport, head

    def write(self, data: bytes | bytearray | memoryview) -> None:
        head, self.head = self.head, b""
        self.transport.write(head + data if head else data)

    def close(self) -> None:  # a response on a connection that closes after it
        if self.head:  # no body bytes (HEAD, an empty body)
            self.write(b"")
        self.transport.close()


class OneWriteCycle(RequestResponseCycle):
    """uvicorn's request cycle, writing a response's head and its first body part with one
    ``transport.write``: uvicorn writes them apart, two ``send`` system calls (and two TCP
    segments) per answer of the data plane's small responses. The head is held from
    ``http.response.start`` until the first ``http.response.body``; a response that never sends
    one (the app failed in between) has its connection closed, as uvicorn closes it, the head unsent.
    An access line ``STATEHOUSE_ACCESS_LOG`` leaves out is not made at all (``app/access_log.py``)."""

    _head: bytes | None = None

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            transport, held = self.transport, _HeldHead()
            self.transport = held
            logged = self.access_log
            if logged and access_log.quiet(self.scope["method"], self.scope["path"], message["status"]):
                self.access_log = False  # not even the record the filter would drop
            try:
                await super().send(message)
            finally:
                self.transport, self.access_log = transport, logged
            self._head = held.data
            return
        head, self._head = self._head, None
        if not head:
            await super().send(message)
            return
        transport, first = self.transport, _HeadFirst(self.transport, head)
        self.transport = first
        try:
            await super().send(message)
        finally:
            self.transport = transport
        if first.head and not self.disconnected:  # no body bytes written (HEAD, an empty body)
            first.write(b"")


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounds on request heads, read times and connections;
    :func:`guarded_protocol` sets the limits (class attributes: uvicorn makes one per connection)."""

    max_header_bytes: ClassVar[int]
    header_timeout_s: ClassVar[float]
    body_timeout_s: ClassVar[float]
    max_connections: ClassVar[int]
    docs_url: ClassVar[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.data_plane = _data_plane(self.app)
        self._awaiting_head = True  # the next bytes belong to a request head
        self._head_bytes = 0  # of the head being received
        self._body_pending = False  # a head has arrived, the end of its body not yet
        self._read_timer: asyncio.TimerHandle | None = None
        self._refused = False  # answered by a limit: the rest of what the parser reads is ignored

    # uvicorn's protocol narrows asyncio's BaseTransport to Transport (and ignores the same error).
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._refuse(
                "too_many_connections",
                f"the replica has {self.max_connections} connections open (STATEHOUSE_MAX_CONNECTIONS); "
                "retry with backoff, or reuse kept-alive connections",
            )
            return
        self._time_reading(self.header_timeout_s, self._head_timed_out)  # a connection that sends nothing

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._awaiting_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._refused or self.transport.is_closing():
            return
        # Timers only for what is still incomplete once a chunk is parsed: a whole request in one
        # chunk (the usual case, kept-alive) costs no timer at all.
        if self._awaiting_head and self._head_bytes:
            # httptools keeps a header it has not seen the end of in memory: stop before it grows.
            if self._head_bytes > self.max_header_bytes:
                self._refuse_head()
            elif self._read_timer is None:
                self._time_reading(self.header_timeout_s, self._head_timed_out)
        elif self._body_pending and self._read_timer is None:
            self._time_reading(self.body_timeout_s, self._body_timed_out)

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._stop_timer()
        # A head that ended inside the chunk that took the count over the limit: measure it.
        if self._head_bytes > self.max_header_bytes and self._head_size() > self.max_header_bytes:
            self._refuse_head()
            return
        self._body_pending = True
        super().on_headers_complete()
        if self.cycle is not None and type(self.cycle) is RequestResponseCycle:
            # Its task is created, not yet run: from its first send on, one write per answer.
            self.cycle.__class__ = OneWriteCycle

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._stop_timer()
        self._awaiting_head, self._head_bytes, self._body_pending = True, 0, False
        super().on_message_complete()

    # -- the data plane, beside ASGI ------------------------------------------------------------

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # Where uvicorn starts a request's ASGI task (at once, or after a pipelined one before it).
        plane, scope = self.data_plane, cast(Scope, cycle.scope)  # uvicorn's TypedDict, as ASGI's mapping
        found = plane.route(scope) if plane is not None and app is self.app else None
        if found is None:
            super()._start_asgi_task(cycle, app)
            return
        answer = self._answer_data_plane(cycle, plane, found)  # type: ignore[arg-type]  # plane is set
        context = contextvars.Context() if self.config.reset_contextvars else None
        task = self.loop.create_task(answer, context=context)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _answer_data_plane(self, cycle: RequestResponseCycle, plane: DataPlane, found: Found) -> None:
        """Answer a data-plane request with ``plane`` (the body read through the cycle, as an ASGI
        app reads it: flow control and ``Expect: 100-continue`` kept), the response written as
        one HTTP message with the server's default headers, then the cycle ended as uvicorn ends it."""
        scope = cast(Scope, cycle.scope)
        try:
            response = await plane.answer(scope, cast(Receive, cycle.receive), found)
            if cycle.disconnected:
                return
            if cycle.flow.write_paused:
                await cycle.flow.drain()
            cycle.response_started, cycle.waiting_for_100_continue = True, False
            status = response.status_code
            if cycle.access_log and not access_log.quiet_data_plane(status):
                await self._forwarded(cycle.scope)
                cycle.access_logger.info(
                    '%s - "%s %s HTTP/%s" %d',
                    get_client_addr(cycle.scope),
                    scope["method"],
                    get_path_with_query_string(cycle.scope),
                    scope["http_version"],
                    status,
                )
            message: list[bytes | memoryview] = [STATUS_LINE[status]]
            for name, value in (*cycle.default_headers, *response.raw_headers):
                message += (name, b": ", value, b"\r\n")
            if not cycle.keep_alive:
                message.append(b"connection: close\r\n")
            message += (b"\r\n", response.body)
            self.transport.write(b"".join(message))
            cycle.response_complete = True
            cycle.message_event.set()
            if not cycle.keep_alive:
                self.transport.close()
            cycle.on_response()
        except asyncio.CancelledError:  # the server shut down under it
            self.transport.close()
            raise
        except Exception:  # the transport failed: logged and closed, as uvicorn's cycle does
            self.logger.exception("the data plane failed to answer %s %s", scope["method"], scope["path"])
            self.transport.close()
        finally:
            cycle.on_response = lambda: None

    async def _forwarded(self, scope: HTTPScope) -> None:
        """The client (and scheme) as uvicorn's proxy-header layer, which the data plane skips, sets
        them in ``scope`` (``X-Forwarded-For`` from a trusted proxy): for an access line only."""
        if self.config.proxy_headers:
            trusted = self.config.forwarded_allow_ips
            await _proxy_layer(tuple(trusted) if isinstance(trusted, list) else trusted)(scope, _nothing, _nothing)

    # -- limits ---------------------------------------------------------------------------------

    def _head_size(self) -> int:
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def _refuse_head(self) -> None:
        self._refuse(
            "header_too_large",
            f"the request line and headers are over {self.max_header_bytes:,} bytes (STATEHOUSE_MAX_HEADER_BYTES); "
            "send large data in the body",
        )

    def _time_reading(self, seconds: float, expired: Any) -> None:
        self._stop_timer()
        self._read_timer = self.loop.call_later(seconds, expired)

    def _stop_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _head_timed_out(self) -> None:
        self._read_timer = None
        if self._answering():  # a pipelined head behind a request still running: its time starts after
            self._time_reading(self.header_timeout_s, self._head_timed_out)
        elif not self.transport.is_closing():
            self._refuse(
                "request_timeout",
                f"the request line and headers did not arrive within {self.header_timeout_s:g} s "
                "(STATEHOUSE_HEADER_TIMEOUT_S)",
            )

    def _body_timed_out(self) -> None:
        # The application is reading the body: it sees the client disconnect; nothing more can be sent.
        self._read_timer = None
        self.logger.warning(
            "closed a connection whose request body did not arrive within %g s (STATEHOUSE_BODY_TIMEOUT_S)",
            self.body_timeout_s,
        )
        self.transport.close()

    def _answering(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _refuse(self, code: str, detail: str) -> None:
        self._refused = True
        self._stop_timer()
        if not self._answering():  # else an answer would land inside the running request's
            self.transport.write(_refusal(code, detail, self.docs_url))
        self.transport.close()


async def _nothing(*_args: Any) -> Any:
    return None


@functools.cache
def _proxy_layer(trusted: str | tuple[str, ...]) -> ProxyHeadersMiddleware:
    """uvicorn's proxy-header layer over no app, made once per trusted-hosts setting (it parses
    them): what it sets in a scope is what the server's own layer would."""
    return ProxyHeadersMiddleware(_nothing, list(trusted) if isinstance(trusted, tuple) else trusted)


def _data_plane(app: Any) -> DataPlane | None:
    """The data plane of the Statehouse app under uvicorn's wrappers (proxy headers, message
    logging), or None: another app, or one mounted under a root path."""
    while app is not None:
        plane = getattr(app, "data_plane", None)
        if isinstance(plane, DataPlane):
            return plane if not app.root_path else None
        app = getattr(app, "app", None)
    return None


def guarded_protocol(settings: Settings) -> type[GuardedHttpToolsProtocol]:
    """The protocol class with ``settings``' limits."""
    limits = {
        "max_header_bytes": settings.max_header_bytes,
        "header_timeout_s": settings.header_timeout_s,
        "body_timeout_s": settings.body_timeout_s,
        "max_connections": settings.max_connections,
        "docs_url": settings.problem_docs_url,
    }
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), limits)


def log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging configuration plus the server's own loggers (``statehouse.*``, one per
    module) on stderr at ``level``, each line naming its logger. Without it they would have no
    handler: only warnings would reach stderr, through Python's last-resort handler."""
    conf = copy.deepcopy(LOGGING_CONFIG)
    conf["formatters"]["statehouse"] = {
        "()": "uvicorn.logging.DefaultFormatter",
        "fmt": "%(levelprefix)s %(name)s: %(message)s",
        "use_colors": None,
    }
    conf["handlers"]["statehouse"] = {
        "formatter": "statehouse",
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stderr",
    }
    conf["loggers"]["statehouse"] = {"handlers": ["statehouse"], "level": level.upper(), "propagate": False}
    return conf


def config(settings: Settings, host: str, port: int, app: str = APP, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration of the server: the app, the guarded protocol, the keep-alive
    timeout, the log. ``app`` is another ASGI app only for bench/bare_asgi.py (the stack's floor)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(settings),
        # uvicorn annotates it int, but passes it to loop.call_later, which takes float seconds.
        timeout_keep_alive=settings.keep_alive_timeout_s,  # type: ignore[arg-type]
        log_config=log_config(settings.log_level),
        **options,
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m statehouse.app.serve``: run one replica under uvicorn with the server's own
    connection limits and timeouts, on ``--host`` and ``--port``, its settings from ``STATEHOUSE_*``."""
    parser = argparse.ArgumentParser(
        prog="python -m statehouse.app.serve",
        description="Run the Statehouse server (settings: STATEHOUSE_* variables, docs/operations.md).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--timeout-graceful-shutdown", type=int, default=None, help="seconds to drain in-flight requests on SIGTERM"
    )
    parser.add_argument("--no-server-header", action="store_true", help="send no Server header")
    parser.add_argument("--no-access-log", action="store_true", help="no access log at all")
    args = parser.parse_args(argv)
    settings = load_settings()  # a bad STATEHOUSE_* variable: one line each, exit 2
    options: dict[str, Any] = {"server_header": not args.no_server_header, "access_log": not args.no_access_log}
    if args.timeout_graceful_shutdown is not None:
        options["timeout_graceful_shutdown"] = args.timeout_graceful_shutdown
    uvicorn.Server(config(settings, args.host, args.port, **options)).run()


if __name__ == "__main__":
    main()
