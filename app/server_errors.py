"""Unexpected server faults: a 500 problem that names a request id, on a connection that stays open.

Starlette's own handler re-raises after answering, and uvicorn then drops the keep-alive
connection without ``Connection: close``: the client's next request on it fails with
ECONNRESET. This middleware answers and swallows the exception instead, so only the request
that hit the fault fails. The id (the caller's ``X-Request-ID`` when it is a sane one) is in
the problem, the response header and the log line, to find one in the other.
"""

from __future__ import annotations

import logging
import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from statehouse.app.metrics import Metrics
from statehouse.app.problems import problem_response

log = logging.getLogger("statehouse")

_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


def request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id" and _REQUEST_ID.fullmatch(value):
            return value.decode("ascii")
    return uuid.uuid4().hex


class ServerErrorMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            if started:  # half a response is out: only closing the connection can say so
                raise
            rid = request_id(scope)
            log.exception("unhandled error on %s %s (request id %s)", scope.get("method"), scope.get("path"), rid)
            self.metrics.errors.labels("internal_error").inc()
            response = problem_response(
                500,
                "internal_error",
                f"internal error; the server log has it under request id {rid}",
                scope.get("path"),
                {"X-Request-ID": rid},
                request_id=rid,
            )
            await response(scope, receive, send)
