"""The columnar endpoint: one operation over a whole Arrow batch (Spark's pandas and Arrow UDFs)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson
import pyarrow as pa
from fastapi import Request, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from statehouse.app import openapi as doc
from statehouse.app.dependencies import JobDep, Service, ServiceDep, get_job, require_token, service_of
from statehouse.app.models import ColumnsResponse
from statehouse.app.offload import run_engine
from statehouse.app.problems import ApiError, state_error
from statehouse.app.routing import api_router, check_target, route_path
from statehouse.app.wire import JSON, arrow_response, read_arrow
from statehouse.backends.attempts import run_columns
from statehouse.backends.bounds import MAX_EPOCH, MAX_PARTITION, MAX_SEQ
from statehouse.backends.codec import parse_decimal
from statehouse.backends.columns import ColumnOp
from statehouse.backends.errors import StateError
from statehouse.backends.job import Job
from statehouse.backends.staging import ATTEMPT_PATTERN, AttemptRef
from statehouse.protocol.ops import COLUMN_OPS, ColumnOpName

router = api_router(prefix="/v1", tags=["batch"])
W = TypeVar("W")


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


# Declared here and read by hand (below): FastAPI's per-parameter validation costs more than the
# rest of a small columnar request, and these four are optional integers and one id.
ATTEMPT_PARAMETERS = [
    _query(
        "epoch", "the writer epoch (fencing), as in a batch", {"type": "integer", "minimum": 0, "maximum": MAX_EPOCH}
    ),
    _query(
        "partition", "Spark partition of the task attempt", {"type": "integer", "minimum": 0, "maximum": MAX_PARTITION}
    ),
    _query("attempt", "task attempt id", {"type": "string", "pattern": ATTEMPT_PATTERN}),
    _query(
        "seq", "the attempt's request number to this replica", {"type": "integer", "minimum": 0, "maximum": MAX_SEQ}
    ),
]


def query_count(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    number = parse_decimal(raw)
    if number is None or number < 0:
        raise ApiError(
            "invalid_argument",
            f"query parameter {name!r} must be a non-negative integer (ASCII digits); got {raw!r}",
        )
    return number


def request_attempt(request: Request) -> AttemptRef | None:
    """The task attempt a request comes from, if it names one (see the batch endpoint)."""
    partition, seq = query_count(request, "partition"), query_count(request, "seq")
    attempt = request.query_params.get("attempt")
    if attempt is None and partition is None and seq is None:
        return None
    return AttemptRef(partition, attempt, seq)  # type: ignore[arg-type]  # validates all three


@router.post(
    "/jobs/{job}/states/{state}/columns/{op}",
    response_model=ColumnsResponse,
    openapi_extra={"requestBody": doc.COLUMNS_BODY, "parameters": ATTEMPT_PARAMETERS},
    responses=doc.COLUMNS,
)
async def columns(service: ServiceDep, job: JobDep, state: str, op: ColumnOpName, request: Request) -> Response:
    """One operation on one state for every row of an Arrow IPC stream, applied in order and
    atomically, with the rules of the batch endpoint (same state kinds, TTL, ownership, limits).
    Reads answer the request's columns plus `value` as an Arrow stream; typed states
    (`value_type`) answer that Arrow type. `epoch` fences; `partition`, `attempt` and `seq` stage
    the rows for a Spark task attempt, as the batch endpoint's body fields do."""
    return await serve(service, job, state, op, request)


@dataclass(frozen=True, slots=True)
class ColumnarRequest(Generic[W]):
    """A columnar request, read: its operation parsed from the Arrow body, the body's size (what
    staging counts), and the task attempt and writer epoch its query parameters name."""

    work: W
    size: int
    attempt: AttemptRef | None
    epoch: int | None

    def written(self, op: str, rows: int) -> Response:
        """The answer to a write: how many rows were applied, or staged for the task attempt."""
        return Response(orjson.dumps({"op": op, "rows": rows, "staged": self.attempt is not None}), media_type=JSON)


async def read_columnar(service: Service, request: Request, parse: Callable[[pa.Table], W]) -> ColumnarRequest[W]:
    """Read an Arrow IPC body (at most STATEHOUSE_MAX_BATCH_OPS rows) into ``parse``'s operation,
    then the attempt parameters: what every columnar endpoint does first."""
    raw = await request.body()
    settings = service.settings
    table = read_arrow(raw, settings.max_body_bytes, settings.max_batch_ops)
    service.check_batch_size(table.num_rows, "rows")
    work = parse(table)
    return ColumnarRequest(work, len(raw), request_attempt(request), query_count(request, "epoch"))


async def serve(service: Service, job: Job, state: str, op: str, request: Request) -> Response:
    """The endpoint's work once the request is authorized and its job found (both routes)."""
    read = await read_columnar(service, request, lambda table: ColumnOp.parse(state, op, table))
    work = read.work
    values = await run_engine(
        job, lambda: run_columns(job, work, epoch=read.epoch, attempt=read.attempt, size=read.size), work.rows
    )
    service.metrics.count_ops(Counter({(job.descriptor(state).kind, op): work.rows}))
    if values is not None:
        return arrow_response(work.columns.append_column("value", values))
    return read.written(op, work.rows)


_PATH = re.compile(r"/v1/jobs/(?P<job>[^/]+)/states/(?P<state>[^/]+)/columns/(?P<op>[^/]+)")
_ROUTE = router.routes[0]  # its path template labels the metrics, as when FastAPI routes the request


class ColumnsFastPath:
    """The columnar endpoint without FastAPI's routing and dependency solving (~200 µs less
    server CPU per request, measured in process): an ASGI layer inside the app's middlewares
    (intake, 500s, metrics) that takes ``POST /v1/jobs/{job}/states/{state}/columns/{op}``
    for a known ``op`` and runs the route's own steps in its order — :func:`check_target`
    (``StrictRoute``), :func:`require_token`, the job lookup (:func:`get_job`), then
    :func:`serve` — answering errors with the app's problem handler. Anything else (an unknown
    ``op``: FastAPI's 422) goes on to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _PATH.fullmatch(route_path(scope))
            if match is not None and match["op"] in COLUMN_OPS:
                scope["route"], scope["path_params"] = _ROUTE, match.groupdict()
                request = Request(scope, receive)
                try:
                    response = await self._serve(request, match["job"], match["state"], match["op"])
                except StateError as exc:
                    response = state_error(request, exc)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    async def _serve(request: Request, job: str, state: str, op: str) -> Response:
        check_target(request.scope)
        await require_token(request)
        service = service_of(request)
        return await serve(service, await get_job(service, job), state, op, request)
