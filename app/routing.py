"""The route class of every router: one strict reading of paths and JSON bodies for all endpoints.

FastAPI parses model-validated bodies with ``json.loads``, which takes ``NaN``, ``Infinity``
and ``1e400`` (read back as ``null``) and nests without limit; uvicorn decodes ``%ff`` in a
path (and Starlette a query string) to U+FFFD, so ``%ff``, ``%fe`` and ``%EF%BF%BD`` would name
one key or namespace. Every route here reads JSON the way the batch endpoint does
(:func:`statehouse.app.wire.loads_json`) and refuses a path or query string that is not UTF-8
once percent-decoded.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import unquote_to_bytes

from fastapi import APIRouter, routing
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import Scope

from statehouse.app.dependencies import GRANT
from statehouse.app.problems import ApiError
from statehouse.app.wire import loads_json, max_values

E = TypeVar("E", bound=Callable[..., Any])

# The endpoints flagged by the decorators below (route handlers live as long as the process).
_DATA_PLANE: set[Callable[..., Any]] = set()
_ADMIN_REASONS: dict[Callable[..., Any], str] = {}


def data_plane(endpoint: E) -> E:
    """Flags a route (under its ``@router.post``) as the data plane: what a Spark job's executors
    call thousands of times a second. The one list of them: the access log leaves out their
    successful calls by default (``app/access_log.py``, given the flagged routes by the app)."""
    _DATA_PLANE.add(endpoint)
    return endpoint


def admin_route(reason: str) -> Callable[[E], E]:
    """Flags a route (under its ``@router.post``) as needing an ``@admin`` token. The route class
    checks it before the handler receives or validates the body, as ``app/intake.py`` checks a
    job's scope: a refused caller gets 403 ``forbidden`` (``reason`` says why) whatever it sends,
    never a 422 about a body it may not send."""

    def flag(endpoint: E) -> E:
        _ADMIN_REASONS[endpoint] = reason
        return endpoint

    return flag


def data_plane_paths(routes: list[BaseRoute]) -> list[str]:
    """The path templates (``/v1/jobs/{job}/batch``) of an app's routes flagged :func:`data_plane`."""
    return [
        context.path
        for context in routing.iter_route_contexts(routes)
        if context.path is not None and getattr(context.original_route, "endpoint", None) in _DATA_PLANE
    ]


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_json(await self.body(), max_values(self))
        return self._json


def check_target(scope: Scope) -> None:
    """A path or query string whose percent-escapes do not decode as UTF-8 names nothing: refuse it."""
    for raw, what in ((scope.get("raw_path") or b"", "path"), (scope.get("query_string") or b"", "query string")):
        if b"%" in raw or not raw.isascii():
            try:
                unquote_to_bytes(raw).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ApiError(
                    "invalid_argument",
                    f"the {what} is not UTF-8 once percent-decoded ({exc.reason} at byte {exc.start}): "
                    "percent-encode keys, names and parameters as UTF-8",
                ) from None


def route_path(scope: Scope) -> str:
    """The path as the app's router matches it: a ``root_path`` (the app mounted under a prefix)
    taken off, as Starlette does."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root + "/") else path


class StrictRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        admin_reason = _ADMIN_REASONS.get(self.endpoint)

        async def strict_handler(request: Request) -> Response:
            # Authorise before anything about the request is validated (the grant is app/intake.py's).
            if admin_reason is not None and not request.scope[GRANT].admin:
                raise ApiError("forbidden", admin_reason)
            check_target(request.scope)
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler


def api_router(**kwargs: Any) -> APIRouter:
    """An ``APIRouter`` whose routes read paths and bodies strictly (every router uses this)."""
    return APIRouter(route_class=StrictRoute, **kwargs)
