"""The data plane's entry beside ASGI: what the server's protocol (``app/serve.py``) hands a
columnar request to, instead of running the app's ASGI stack for it.

A Spark job's executors send thousands of small columnar requests a second. Through ASGI each one
pays for layers that do nothing for it: uvicorn's proxy-header middleware, the app's entry, the
metrics middleware's wrapped ``send``, a scan of the route table for the intake's checks, the
route match, two ASGI messages for the answer and uvicorn's per-header checks of a head the app
built itself (bench/RESULTS.md §26). Here the same steps run in the same order, called directly:
the intake's checks before a byte of the body is read (:class:`~statehouse.app.intake.Admission`),
the route's own steps (``routers/columns.respond``), the metrics, and a 500 with a request id
for a fault; the protocol writes the answer (a Starlette ``Response``) as one HTTP message.
Every other request, and every request under another ASGI server, goes through the app.
"""

from __future__ import annotations

import re
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope

from statehouse.app.intake import Admission
from statehouse.app.metrics import Metrics
from statehouse.app.problems import ApiError, ProblemResponse, state_error
from statehouse.app.routers import columns
from statehouse.app.server_errors import fault_response


class DataPlane:
    """The app's columnar routes, answered without ASGI: :meth:`route` finds whether a request
    (its uvicorn scope, head parsed) is one, :meth:`answer` gives its response."""

    def __init__(self, app: Any, admission: Admission, metrics: Metrics) -> None:
        self.app = app
        self.admission = admission
        self.metrics = metrics

    def route(self, scope: Scope) -> re.Match[str] | None:
        """The columnar route's match of a request, or None (its route then set in ``scope``)."""
        return columns.match(scope)

    async def answer(self, scope: Scope, receive: Receive, found: re.Match[str]) -> Response:
        """The response to a request :meth:`route` found, its body read with ``receive``: as the
        app's layers would answer it (intake, route, metrics, faults), problem types addressed."""
        start = time.perf_counter()
        scope["app"] = self.app  # as Starlette sets it: the service, the problems' settings
        try:
            response = await columns.respond(scope, self.admission.admit(scope, receive), found)
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
