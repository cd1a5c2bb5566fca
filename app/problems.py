"""RFC 9457 problem+json: every error leaves the service through here, with a stable code.

Domain exceptions from the engine carry a ``code``; ``STATUS_BY_CODE`` is the one place
that decides their HTTP status. A problem's ``type`` is ``/problems/<code>``, a relative reference
to the page this service serves for the code (app/problem_pages.py: what it means, what to do);
with ``STATEHOUSE_PROBLEM_DOCS_URL`` set, ``<that URL>#<code>``, an anchor of a published copy of
the codes' table (app/problems.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request, routing
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from statehouse.app.problem_pages import page_path
from statehouse.app.settings import Settings
from statehouse.backends.errors import StateError

PROBLEM_MEDIA_TYPE = "application/problem+json"
DEFAULT_PROBLEM_DOCS_URL: str = Settings.model_fields["problem_docs_url"].default  # "": this service's pages

STATUS_BY_CODE: dict[str, int] = {
    "invalid_name": 422,
    "invalid_argument": 422,
    "invalid_key": 422,
    "invalid_value": 422,
    "value_too_deep": 422,
    "validation_error": 422,
    "key_too_large": 413,
    "value_too_large": 413,
    "batch_too_large": 413,
    "body_too_large": 413,
    "malformed_body": 400,
    "unsupported_media_type": 415,
    "unauthorized": 401,
    "forbidden": 403,
    "job_not_found": 404,
    "state_not_found": 404,
    "key_not_found": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "job_conflict": 409,
    "incompatible_state": 409,
    "wrong_state_kind": 409,
    "untyped_values": 409,
    "operator_state_conflict": 409,
    "key_not_owned": 421,
    "layout_mismatch": 409,
    "rescale_in_progress": 503,
    "batch_in_flight": 409,
    "rescale_pending": 409,
    "rescale_conflict": 409,
    "rescale_incomplete": 409,
    "rescale_decided": 409,
    "rescale_not_decided": 409,
    "rescale_not_loaded": 409,
    "stale_epoch": 409,
    "attempt_lost": 409,
    "attempt_conflict": 409,
    "epoch_sealed": 409,
    "staging_too_large": 413,
    "too_many_jobs": 422,
    "too_many_states": 422,
    "map_too_large": 413,
    "list_too_large": 413,
    "raw_stream_too_large": 413,
    "answer_too_large": 413,
    "not_ready": 503,
    "checkpoint_not_found": 404,
    "checkpoint_conflict": 409,
    "checkpoint_not_ready": 409,
    "checkpoint_failed": 409,
    "restore_incomplete": 409,
    "restore_incompatible": 409,
    "snapshot_corrupt": 422,
    "invalid_location": 400,
    "storage_unavailable": 503,
    "insufficient_storage": 507,
    # Sent by the HTTP server itself (app/serve.py), before a request reaches the application.
    "header_too_large": 431,
    "request_timeout": 408,
    "too_many_connections": 503,
}


class ApiError(StateError):
    """An error of the HTTP layer itself (malformed body, auth, ...), with an explicit code."""

    def __init__(self, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.code = code


def problem_type(code: str, docs_url: str = DEFAULT_PROBLEM_DOCS_URL, root_path: str = "") -> str:
    """The problem ``type`` of a code: ``/problems/<code>``, its page on this service (behind a
    proxy's ``root_path``), or its anchor in a published copy of the table when
    ``STATEHOUSE_PROBLEM_DOCS_URL`` (``docs_url``) is set."""
    if not docs_url:
        return page_path(code, root_path)
    return f"{docs_url}#{code}"


def _docs_url(scope: Scope) -> str:
    service = getattr(getattr(scope.get("app"), "state", None), "service", None)
    return service.settings.problem_docs_url if service is not None else DEFAULT_PROBLEM_DOCS_URL


class ProblemResponse(Response):
    """A problem+json response. Its ``type`` is filled in when it is sent, from the settings of
    the app sending it and the request's ``root_path``, so that every sender (handlers,
    middleware, probes) honours ``STATEHOUSE_PROBLEM_DOCS_URL`` without being handed the settings."""

    media_type = PROBLEM_MEDIA_TYPE

    def __init__(self, problem: dict[str, Any], status_code: int, headers: Mapping[str, str] | None = None) -> None:
        self.problem = problem
        self.problem_type = problem_type(problem["code"])
        super().__init__(self._render(), status_code, headers)

    def _render(self) -> bytes:
        return orjson.dumps({"type": self.problem_type, **self.problem})

    def address(self, scope: Scope) -> None:
        """Fill in ``type`` for the request ``scope`` answers (its app's settings, its root path)."""
        sent = problem_type(self.problem["code"], _docs_url(scope), scope.get("root_path", ""))
        if sent != self.problem_type:
            self.problem_type = sent
            self.body = self._render()
            self.headers["content-length"] = str(len(self.body))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.address(scope)
        await super().__call__(scope, receive, send)


def problem_response(
    status: int,
    code: str,
    detail: str,
    instance: str | None = None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> Response:
    body: dict[str, Any] = {"title": HTTPStatus(status).phrase, "status": status, "code": code, "detail": detail}
    if instance:
        body["instance"] = instance
    body.update(extra)
    return ProblemResponse(body, status, headers)


def _count(request: Request, code: str) -> None:
    service = getattr(request.app.state, "service", None)
    if service is not None:
        service.metrics.errors.labels(code).inc()


def state_error(request: Request, exc: StateError) -> Response:
    _count(request, exc.code)
    status = STATUS_BY_CODE.get(exc.code, 400)
    headers = {"WWW-Authenticate": "Bearer"} if exc.code == "unauthorized" else None
    retry_after_ms = exc.extra.get("retry_after_ms")
    if retry_after_ms is not None:  # the error's own pace; the header counts whole seconds
        headers = {"Retry-After": str(max(1, math.ceil(retry_after_ms / 1000)))}
    return problem_response(status, exc.code, exc.detail, request.url.path, headers, **exc.extra)


def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()]
    detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors) or "invalid request"
    malformed = any(e["type"] == "json_invalid" for e in errors)
    _count(request, "malformed_body" if malformed else "validation_error")
    if malformed:
        return problem_response(400, "malformed_body", f"request body is not valid JSON: {detail}", request.url.path)
    return problem_response(422, "validation_error", detail, request.url.path, errors=errors)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 415: "unsupported_media_type"}


def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    if isinstance(exc.__cause__, StateError):
        # FastAPI turns any error while it reads a body into "400 There was an error parsing
        # the body": the body limit and the strict JSON parser say better what is wrong.
        return state_error(request, exc.__cause__)
    if exc.status_code == 405:
        return _method_not_allowed(request)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    _count(request, code)
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no such resource: {request.method} {request.url.path}"
    return problem_response(exc.status_code, code, detail, request.url.path, exc.headers)


def _method_not_allowed(request: Request) -> Response:
    """``Allow`` names every method of the path (Starlette names one route's); ``OPTIONS``
    is answered with it (RFC 9110 §9.3.7) instead of refused."""
    methods = {"OPTIONS"}
    for context in routing.iter_route_contexts(request.app.routes):  # included routers' routes too
        route = context.original_route
        if route.matches(request.scope)[0] != Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    allow = {"Allow": ", ".join(sorted(methods))}
    if request.method == "OPTIONS":
        return Response(status_code=204, headers=allow)
    _count(request, "method_not_allowed")
    detail = f"{request.method} is not allowed on {request.url.path}; allowed: {allow['Allow']}"
    return problem_response(405, "method_not_allowed", detail, request.url.path, allow)


def install(app: FastAPI) -> None:
    # Starlette types every handler as taking any Exception, though it calls each with an
    # instance of the class it is registered for: a handler typed for that class is refused.
    app.add_exception_handler(StateError, state_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
