"""Unexpected server faults: a 500 problem that names a request id, on a connection that stays open.

Starlette's own handler re-raises after answering, and uvicorn then drops the keep-alive
connection without ``Connection: close``: the client's next request on it fails with
ECONNRESET. The outermost middleware (``MetricsMiddleware``) answers with :func:`answer_fault`
and swallows the exception instead, so only the request that hit the fault fails. The id (the
caller's ``X-Request-ID`` when it is a sane one) is in the problem, the response header and the
log line, to find one from the other.
"""

from __future__ import annotations

import logging
import re
import uuid

from prometheus_client import Counter
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from statehouse.app.problems import problem_response

log = logging.getLogger("statehouse")

_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


def request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id" and _REQUEST_ID.fullmatch(value):
            return value.decode("ascii")
    return uuid.uuid4().hex


def fault_response(scope: Scope, errors: Counter) -> Response:
    """Log the exception being handled under a request id, count it in ``errors`` (by code), and
    give the 500 problem that names the id."""
    rid = request_id(scope)
    log.exception("unhandled error on %s %s (request id %s)", scope.get("method"), scope.get("path"), rid)
    errors.labels("internal_error").inc()
    return problem_response(
        500,
        "internal_error",
        f"internal error; the server log has it under request id {rid}",
        scope.get("path"),
        {"X-Request-ID": rid},
        request_id=rid,
    )


async def answer_fault(scope: Scope, receive: Receive, send: Send, errors: Counter) -> None:
    """Answer the exception being handled with :func:`fault_response`."""
    await fault_response(scope, errors)(scope, receive, send)
