"""The data plane's routes answered without FastAPI's routing, and beside ASGI.

A Spark job's executors send thousands of small requests a second to a few routes: the columnar
ones, the batch, the timers' columns. FastAPI's routing and dependency solving cost ~200 µs of
server CPU per request (measured in process), and through ASGI each request also pays for layers
that do nothing for it: uvicorn's proxy-header middleware, the app's entry, the metrics
middleware's wrapped ``send``, two ASGI messages for the answer and uvicorn's per-header checks of
a head the app built itself (bench/RESULTS.md §26). So:

* each such route declares a :class:`FastRoute`: which requests of its path it takes (values
  FastAPI would refuse with a 422 go through FastAPI, to be refused as it words them) and the
  call that answers them, the route's own function;
* :class:`FastRoutes` runs a route's steps in FastAPI's order: the path's UTF-8 check
  (``StrictRoute``), the grant (``require_token``), the job lookup, the call; errors answered by
  the app's problem handler;
* :class:`FastPath`, an ASGI layer inside the app's middlewares, answers them for any ASGI
  server (plain ``uvicorn statehouse.app.main:app``);
* :class:`DataPlane` is what ``python -m statehouse.app.serve``'s protocol (``app/serve.py``)
  hands them to instead of ASGI: the intake's checks before a byte of the body is read
  (:class:`~statehouse.app.intake.Admission`), the route, the metrics and a 500 with a request id
  for a fault, called directly; the protocol writes the answer as one HTTP message.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from statehouse.app.dependencies import Service, get_job, require_token, service_of
from statehouse.app.intake import Admission
from statehouse.app.metrics import Metrics
from statehouse.app.problems import ApiError, ProblemResponse, state_error
from statehouse.app.routing import check_target, route_path
from statehouse.app.server_errors import fault_response
from statehouse.backends.errors import StateError
from statehouse.backends.job import Job
from statehouse.protocol.routes import pattern

# The call that answers a request: its service, job, request and path parameters.
Call = Callable[[Service, Job, Request, dict[str, str]], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class FastRoute:
    """A POST route under ``/v1/jobs/{job}`` answered without FastAPI: ``route`` is the app's
    (its template labels the metrics), ``takes`` whether a request's path parameters and query
    string are ones FastAPI would accept, ``call`` the route's work."""

    route: Any
    takes: Callable[[dict[str, str], bytes], bool]
    call: Call
    path: re.Pattern[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", pattern(self.route.path))


def route_of(routes: list[Any], endpoint: Callable[..., Any]) -> Any:
    """The route of ``routes`` (a router's) whose endpoint is ``endpoint``."""
    return next(route for route in routes if getattr(route, "endpoint", None) is endpoint)


# A request a fast route takes: the route and the request's path parameters.
Found = tuple[FastRoute, dict[str, str]]


class FastRoutes:
    """The app's fast routes, in the order they are tried."""

    def __init__(self, routes: list[FastRoute]) -> None:
        self.routes = routes

    def match(self, scope: Scope) -> Found | None:
        """The fast route that takes this request, or None; its route and path parameters are
        then set in ``scope``, as FastAPI's routing sets them."""
        if scope["method"] != "POST":
            return None
        path = route_path(scope)
        for fast in self.routes:
            found = fast.path.fullmatch(path)
            if found is not None:
                params = found.groupdict()
                if not fast.takes(params, scope.get("query_string", b"")):
                    return None
                scope["route"], scope["path_params"] = fast.route, params
                return fast, params
        return None

    async def respond(self, scope: Scope, receive: Receive, found: Found) -> Response:
        """The answer to a request :meth:`match` found, by the route's steps in FastAPI's order."""
        fast, params = found
        request = Request(scope, receive)
        try:
            check_target(scope)
            await require_token(request)
            service = service_of(request)
            return await fast.call(service, await get_job(service, params["job"]), request, params)
        except StateError as exc:
            return state_error(request, exc)


class FastPath:
    """The ASGI layer (inside the intake, the 500s and the metrics) that answers what
    :class:`FastRoutes` takes; anything else goes on to the app."""

    def __init__(self, app: ASGIApp, routes: FastRoutes) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.routes.match(scope) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        response = await self.routes.respond(scope, receive, found)
        await response(scope, receive, send)


class DataPlane:
    """The fast routes answered without ASGI: :meth:`route` finds whether a request (its uvicorn
    scope, head parsed) is one, :meth:`answer` gives its response as the app's layers would
    (intake, route, metrics, faults), problem types addressed."""

    def __init__(self, app: Any, admission: Admission, metrics: Metrics, routes: FastRoutes) -> None:
        self.app = app
        self.admission = admission
        self.metrics = metrics
        self.routes = routes

    def route(self, scope: Scope) -> Found | None:
        return self.routes.match(scope)

    async def answer(self, scope: Scope, receive: Receive, found: Found) -> Response:
        """The response to a request :meth:`route` found, its body read with ``receive``."""
        start = time.perf_counter()
        scope["app"] = self.app  # as Starlette sets it: the service, the problems' settings
        try:
            response = await self.routes.respond(scope, self.admission.admit(scope, receive), found)
        except ApiError as exc:  # refused by the intake, the body unread
            response = state_error(Request(scope), exc)
        except Exception:
            response = fault_response(scope, self.metrics.errors)
        if isinstance(response, ProblemResponse):
            response.address(scope)
        self.metrics.observe_request(
            scope["method"], scope["route"].path, response.status_code, time.perf_counter() - start
        )
        return response
