"""What every request passes before a byte of its body is received, in this order:

1. **Authentication** (every path under ``/v1``): 401 ``unauthorized``, or 403 ``forbidden`` for a
   route of a job the token is not scoped to. FastAPI solves dependencies only after it has read
   and decoded the body, so a 64 MiB body without a token would cost ~1.5 GB before its 401;
   here the body is never received. Routes read the grant decided here (``require_token``).
2. **Content type** (routes that take a body): 415 ``unsupported_media_type`` naming what the
   route accepts. A missing or wrong type (``curl -d`` sends a form type) would otherwise
   reach the model validator as a confusing 422. A route whose body is optional takes no body without one.
3. **Size**: 413 ``body_too_large`` past ``STATEHOUSE_MAX_BODY_BYTES``, from Content-Length, or
   counted while the body is read when it has none (chunked). Not Starlette's own limit: it
   answers ``text/plain``, and every error here is problem+json with a code and what to do.

What each route takes is read once, from the app's routes, so a new route is covered as it is
added: the media types of its declared ``requestBody`` (routes that read their body themselves),
else JSON for a model body.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fastapi import routing
from starlette.requests import Request
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from statehouse.app.dependencies import GRANT, authenticate
from statehouse.app.problems import ApiError, state_error
from statehouse.app.routing import route_path
from statehouse.app.wire import JSON, media_type
from statehouse.protocol import routes

API_PREFIX = routes.API
# Matched at the start of a path (not the whole of it): every route under a job's path names the job.
_JOB = routes.pattern(routes.JOB)


@dataclass(frozen=True, slots=True)
class BodyRule:
    """What a route's body must be: one of ``accepted`` (canonical media types, see
    :func:`statehouse.app.wire.media_type`); ``optional``: the route also takes no body."""

    accepted: tuple[str, ...]
    optional: bool


def body_rule(route: Any) -> BodyRule | None:
    """What a route takes as a body, or ``None`` when it takes none."""
    declared = (getattr(route, "openapi_extra", None) or {}).get("requestBody")
    if declared:  # read by the route itself: always needs one
        return BodyRule(tuple(declared["content"]), optional=False)
    field = getattr(route, "body_field", None)
    if field is not None:
        return BodyRule((JSON,), optional=not field.field_info.is_required())
    return None


@dataclass(frozen=True, slots=True)
class _Entry:
    path: re.Pattern[str]
    rule: BodyRule | None


def body_routes(routes: list[Any]) -> dict[str, list[_Entry]]:
    """Per method, the routes in the order the app matches them (an earlier route of the same
    method wins, as in Starlette), each with what it takes as a body."""
    table: dict[str, list[_Entry]] = {}
    for context in routing.iter_route_contexts(routes):
        route = context.original_route
        methods = getattr(route, "methods", None)
        if not methods or context.path is None:
            continue
        entry = _Entry(compile_path(context.path)[0], body_rule(route))
        for method in methods:
            table.setdefault(method, []).append(entry)
    # A method none of whose routes takes a body (GET, DELETE, ...) needs no lookup at all.
    return {method: entries for method, entries in table.items() if any(e.rule for e in entries)}


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == wanted:
            return value
    return None


def _has_body(scope: Scope) -> bool:
    length = _header(scope, b"content-length")
    return (length is not None and length.strip(b" 0") != b"") or _header(scope, b"transfer-encoding") is not None


def unsupported(content_type: str | None, accepted: tuple[str, ...]) -> ApiError:
    wanted = " or ".join(accepted)
    sent = f"Content-Type {content_type!r} is" if content_type else "a body without a Content-Type is"
    hint = " (curl -d sends application/x-www-form-urlencoded: add -H 'Content-Type: application/json')"
    return ApiError(
        "unsupported_media_type",
        f"{sent} not accepted here; send {wanted}" + (hint if accepted == (JSON,) else ""),
    )


class Admission:
    """The three checks above, for an app's routes: what :class:`Intake` runs for every request,
    and the data plane's own entry (``app/data_plane.py``) for the requests it takes."""

    def __init__(self, routes: list[Any], max_bytes: int) -> None:
        self.routes = body_routes(routes)
        self.max_bytes = max_bytes
        self.too_large = f"request body exceeds {max_bytes} bytes (STATEHOUSE_MAX_BODY_BYTES); send smaller batches"

    def admit(self, scope: Scope, receive: Receive) -> Receive:
        """Run the checks (:class:`ApiError` when one fails, the body not received) and give the
        ``receive`` to read the body with: ``receive`` itself when Content-Length declared the
        body's length (the HTTP parser reads no more), else one that counts what arrives."""
        if self._check(scope):
            return receive
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise ApiError("body_too_large", self.too_large)
            return message

        return counting_receive

    def _check(self, scope: Scope) -> bool:
        """The checks; whether the body's length is declared (Content-Length), so already checked."""
        path = route_path(scope)
        if path == API_PREFIX or path.startswith(API_PREFIX + "/"):
            job = _JOB.match(path)
            scope[GRANT] = authenticate(scope, job["job"] if job else None)
        entries = self.routes.get(scope["method"])
        rule = next((e.rule for e in entries if e.path.match(path)), None) if entries else None
        if rule is not None and not (rule.optional and not _has_body(scope)):
            content_type = _header(scope, b"content-type")
            text = content_type.decode("latin-1") if content_type is not None else None
            if media_type(text) not in rule.accepted:
                raise unsupported(text, rule.accepted)
        length = _header(scope, b"content-length")
        if length is None or not length.isdigit():
            return False
        if int(length) > self.max_bytes:
            raise ApiError("body_too_large", self.too_large)
        return True


class Intake:
    """The ASGI layer that runs :class:`Admission`'s checks, outside everything that reads a body."""

    def __init__(self, app: ASGIApp, admission: Admission) -> None:
        self.app = app
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            receive = self.admission.admit(scope, receive)
        except ApiError as exc:
            await state_error(Request(scope), exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)
