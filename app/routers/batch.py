"""The batch endpoint: the hot path for Spark executors."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import Request, Response

from statehouse.app import openapi as doc
from statehouse.app.data_plane import FastRoute, route_of
from statehouse.app.dependencies import JobDep, ServiceDep
from statehouse.app.models import BatchResponse
from statehouse.app.offload import dispatch
from statehouse.app.problems import ApiError
from statehouse.app.routing import api_router, data_plane
from statehouse.app.wire import from_base64, is_msgpack, read_body, render
from statehouse.backends.attempts import perform
from statehouse.backends.job import Job
from statehouse.backends.ops import BatchOps
from statehouse.backends.staging import AttemptRef
from statehouse.protocol import routes
from statehouse.protocol.ops import OPS, RAW_OPS

router = api_router(tags=["batch"])


@router.post(
    routes.BATCH,
    response_model=BatchResponse,
    openapi_extra={"requestBody": doc.BATCH_BODY},
    responses=doc.BATCH,
)
@data_plane
async def batch(service: ServiceDep, job: JobDep, request: Request) -> Response:
    """Many keyed operations in one request, applied in order and atomically: later operations see
    earlier ones; if any fails, nothing is applied and the problem names the failing op's index.
    An optional `"epoch"` fences writers: a batch naming another epoch than the job's current writer
    epoch (see `POST /v1/jobs/{job}/fence`) is refused with 409 `stale_epoch`.
    With `"partition"`, `"attempt"` and `"seq"` (a Spark task attempt) the writes are staged until the
    driver commits the epoch (`POST /v1/jobs/{job}/epochs/{epoch}/commit`) and the batch's reads see the
    attempt's own staged writes; a re-sent request (same `seq`) is answered again, not applied twice.
    Send and receive `application/json` or `application/msgpack` (bytes values allowed). Raw state's
    operations (`raw_*`) carry bytes: msgpack bin, or base64 strings in a JSON body."""
    body = await read_body(request)
    operations = body.get("ops") if isinstance(body, dict) else None
    if not isinstance(operations, list):
        raise ApiError("invalid_argument", 'the body must be an object {"ops": [...]}')
    service.check_batch_size(len(operations), "operations")
    if not is_msgpack(request.headers.get("content-type")):
        _raw_values_from_base64(operations)
    attempt = AttemptRef.named_in(body)
    size = len(await request.body())
    results = await dispatch(
        job,
        lambda: perform(job, BatchOps(operations), epoch=body.get("epoch"), attempt=attempt, size=size),
        len(operations),
    )
    service.metrics.count_ops(_tally(job, operations))
    return render(request, {"results": results})


# The batch without FastAPI's routing (app/data_plane.py): its only parameter is the job.
FAST_ROUTES = [
    FastRoute(
        route_of(router.routes, batch),
        lambda _params, _query: True,
        lambda service, job, request, _p: batch(service, job, request),
    )
]

_RAW_WRITES = frozenset(name for name in RAW_OPS if "value" in OPS[name].fields)


def _raw_values_from_base64(operations: list[Any]) -> None:
    """A JSON body's raw-state values as bytes (JSON has none: base64, as JSON answers carry them);
    any other operation is left as it came, and checked by the engine."""
    for index, op in enumerate(operations):
        name = op.get("op") if isinstance(op, dict) else None
        if isinstance(name, str) and name in _RAW_WRITES and "value" in op:
            value = op["value"]
            try:
                if isinstance(value, list):  # raw_operator_put: the partitions
                    op["value"] = [from_base64(p, f"partition {i}") for i, p in enumerate(value)]
                else:
                    op["value"] = from_base64(value, "'value'")
            except ApiError as exc:
                raise exc.within(f"op {index}", op_index=index) from None


def _tally(job: Job, operations: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    """Operations per (state kind, op) of an applied batch, counted in one pass (operations that
    name no state count under their target: ``timer``, ``raw_keyed``, ``raw_operator``)."""
    tally: Counter[tuple[str, str]] = Counter()
    for (state, op), n in Counter((o.get("state", ""), o["op"]) for o in operations).items():
        target = OPS[op].target
        tally[(job.descriptor(state).kind if target == "state" else target, op)] += n
    return tally
