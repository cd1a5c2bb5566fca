"""The columnar endpoint: one operation over a whole Arrow batch (Spark's pandas and Arrow UDFs)."""

from __future__ import annotations

from collections import Counter
from typing import TypeVar

from fastapi import Request, Response

from statehouse.app import openapi as doc
from statehouse.app.columnar_request import ATTEMPT_PARAMETERS, STATES_PARAMETER, ColumnarRequest, read_columnar
from statehouse.app.data_plane import FastRoute, route_of
from statehouse.app.dependencies import JobDep, Service, ServiceDep
from statehouse.app.models import ColumnsResponse
from statehouse.app.offload import dispatch
from statehouse.app.problems import ApiError
from statehouse.app.routing import api_router, data_plane
from statehouse.app.wire import arrow_response
from statehouse.backends.attempts import perform
from statehouse.backends.columns import ColumnOp, StatesColumnOp
from statehouse.backends.job import Job
from statehouse.protocol.ops import COLUMN_OPS, ColumnOpName
from statehouse.protocol.routes import JOB_COLUMNS, STATE_COLUMNS

router = api_router(tags=["batch"])


@router.post(
    STATE_COLUMNS,
    response_model=ColumnsResponse,
    openapi_extra={"requestBody": doc.COLUMNS_BODY, "parameters": ATTEMPT_PARAMETERS},
    responses=doc.COLUMNS,
)
@data_plane
async def columns(service: ServiceDep, job: JobDep, state: str, op: ColumnOpName, request: Request) -> Response:
    """One operation on one state for every row of an Arrow IPC stream, applied in order and
    atomically, with the rules of the batch endpoint (same state kinds, TTL, ownership, limits).
    Reads answer the request's columns plus `value` as an Arrow stream; typed states
    (`value_type`) answer that Arrow type. `epoch` fences; `partition`, `attempt` and `seq` stage
    the rows for a Spark task attempt, as the batch endpoint's body fields do."""
    return await serve(service, job, state, op, request)


@router.post(
    JOB_COLUMNS,
    response_model=ColumnsResponse,
    openapi_extra={"requestBody": doc.STATES_COLUMNS_BODY, "parameters": [STATES_PARAMETER, *ATTEMPT_PARAMETERS]},
    responses=doc.COLUMNS,
)
@data_plane
async def states_columns(service: ServiceDep, job: JobDep, op: ColumnOpName, request: Request) -> Response:
    """One operation on several states (`states`, comma-separated) for every row of an Arrow IPC
    stream, in one transaction: the rows' `key` (and `ns`, `user_key`) once, and one value column
    per state, `value:<state>`, for an operation that takes values; each state's rows apply as
    the one-state endpoint applies them, state after state. Reads and `add_get` answer the shared
    columns plus `value:<state>` per state; other writes how many writes (rows times states)
    were applied or staged."""
    return await serve(service, job, None, op, request)


async def serve(service: Service, job: Job, state: str | None, op: str, request: Request) -> Response:
    """The endpoint's work once the request is authorized and its job found (every route):
    one state's operation, or (``state`` None) the operation on the states ``states`` names."""
    if state is None:
        states = _states(request)
        many = await read_columnar(service, request, lambda table: StatesColumnOp.parse(states, op, table))
        service.check_batch_size(many.work.rows, "rows (times states)")
        return await _apply(service, job, op, many, many.work.ops)
    one = await read_columnar(service, request, lambda table: ColumnOp.parse(state, op, table))
    return await _apply(service, job, op, one, [one.work])


# A columnar request's work: one state's (answering one value column) or several states' (one per state).
AnyColumnOp = TypeVar("AnyColumnOp", ColumnOp, StatesColumnOp)


async def _apply(
    service: Service, job: Job, op: str, read: ColumnarRequest[AnyColumnOp], ops: list[ColumnOp]
) -> Response:
    """Apply the request's work (as :func:`dispatch` runs it), count its operations per state
    kind, and answer: the values as Arrow, or how many rows were written or staged."""
    work = read.work
    values = await dispatch(
        job, lambda: perform(job, work, epoch=read.epoch, attempt=read.attempt, size=read.size), work.rows
    )
    service.metrics.count_ops(Counter({(job.descriptor(one.state).kind, op): one.rows for one in ops}))
    if values is not None:
        return arrow_response(work.answer(values))
    return read.written(op, work.rows)


def _states(request: Request) -> list[str]:
    raw = request.query_params.get("states")
    if not raw:
        raise ApiError("invalid_argument", "query parameter 'states' names the states, comma-separated (states=a,b)")
    return raw.split(",")


def _known_op(params: dict[str, str], _query: bytes) -> bool:
    return params["op"] in COLUMN_OPS  # else FastAPI's 422 names the ops


# The columnar routes without FastAPI's routing (app/data_plane.py): what the executors call most.
FAST_ROUTES = [
    FastRoute(
        route_of(router.routes, columns),
        _known_op,
        lambda service, job, request, p: serve(service, job, p["state"], p["op"], request),
    ),
    FastRoute(
        route_of(router.routes, states_columns),
        _known_op,
        lambda service, job, request, p: serve(service, job, None, p["op"], request),
    ),
]
