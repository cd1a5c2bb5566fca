"""The columnar endpoint: one operation over a whole Arrow batch (Spark's pandas and Arrow UDFs)."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Query, Request, Response

from statehouse.app import openapi as doc
from statehouse.app.dependencies import JobDep, ServiceDep
from statehouse.app.models import ColumnsResponse
from statehouse.app.problems import ApiError
from statehouse.app.wire import JSON, arrow_response, read_arrow
from statehouse.backends.attempts import run_columns
from statehouse.backends.columns import ColumnOp
from statehouse.backends.staging import ATTEMPT_PATTERN, AttemptRef

router = APIRouter(prefix="/v1", tags=["batch"])

ColumnOpName = Literal["get", "put", "add", "clear", "map_get", "map_put", "map_add", "map_remove"]


@router.post(
    "/jobs/{job}/states/{state}/columns/{op}",
    response_model=ColumnsResponse,
    openapi_extra={"requestBody": doc.COLUMNS_BODY},
    responses=doc.COLUMNS,
)
async def columns(
    service: ServiceDep,
    job: JobDep,
    state: str,
    op: ColumnOpName,
    request: Request,
    epoch: Annotated[int | None, Query(ge=0, description="the writer epoch (fencing), as in a batch")] = None,
    partition: Annotated[int | None, Query(ge=0, description="Spark partition of the task attempt")] = None,
    attempt: Annotated[str | None, Query(pattern=ATTEMPT_PATTERN, description="task attempt id")] = None,
    seq: Annotated[int | None, Query(ge=0, description="the attempt's request number to this replica")] = None,
) -> Response:
    """One operation on one state for every row of an Arrow IPC stream, applied in order and
    atomically, with the rules of the batch endpoint (same state kinds, TTL, ownership, limits).
    Reads answer the request's columns plus `value` as an Arrow stream; typed states
    (`value_type`) answer that Arrow type. `epoch` fences; `partition`, `attempt` and `seq` stage
    the rows for a Spark task attempt, as the batch endpoint's body fields do."""
    raw = await request.body()
    table = read_arrow(request.headers.get("content-type"), raw)
    if table.num_rows > service.settings.max_batch_ops:
        raise ApiError(
            "batch_too_large",
            f"{table.num_rows} rows exceed the limit of {service.settings.max_batch_ops} "
            "(STATEHOUSE_MAX_BATCH_OPS); split the batch",
        )
    work = ColumnOp.parse(state, op, table)
    ref = None
    if attempt is not None or partition is not None or seq is not None:
        ref = AttemptRef(partition, attempt, seq)  # type: ignore[arg-type]
    values = run_columns(job, work, epoch=epoch, attempt=ref, size=len(raw))
    service.metrics.count_ops(Counter({(job.descriptor(state).kind, op): work.rows}))
    if values is not None:
        return arrow_response(work.columns.append_column("value", values))
    summary = {"op": op, "rows": work.rows, "staged": ref is not None}
    return Response(orjson.dumps(summary), media_type=JSON)
