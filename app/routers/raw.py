"""Raw state: a byte stream per key group (raw keyed state) and byte partitions per operator
subtask (raw operator state), as ``application/octet-stream`` (``backends/raw_state.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query, Request, Response
from pydantic import BeforeValidator

from statehouse.app import openapi as doc
from statehouse.app.dependencies import JobDep
from statehouse.app.models import canonical_index
from statehouse.app.offload import OFF_LOOP, in_transaction
from statehouse.app.problems import ApiError
from statehouse.app.routers.operators import Index
from statehouse.app.routing import api_router
from statehouse.app.wire import from_base64, is_msgpack, read_body, render
from statehouse.backends.bounds import MAX_EPOCH
from statehouse.backends.redistribution import MAX_SUBTASKS
from statehouse.protocol import routes

router = api_router(tags=["raw state"])

KeyGroup = Annotated[
    int,
    Path(ge=0, le=MAX_SUBTASKS - 1, description="key group, below the job's max_parallelism"),
    BeforeValidator(canonical_index),
]

Epoch = Annotated[
    int | None,
    Query(
        ge=0,
        le=MAX_EPOCH,
        description="the writer epoch (fencing, as in a batch): a write naming another epoch than the job's "
        "current one is refused with 409 stale_epoch",
    ),
]


def _body(what: str) -> dict[str, object]:
    return {
        "requestBody": {
            "required": True,
            "content": {routes.OCTET_STREAM: {"schema": doc.OCTET_SCHEMA, "description": what}},
        }
    }


@router.get(
    routes.RAW_KEY_GROUP,
    response_class=Response,
    responses={200: {"content": {routes.OCTET_STREAM: {"schema": doc.OCTET_SCHEMA}}}, **doc.RAW_KEYED_READ},
)
async def get_raw_stream(job: JobDep, key_group: KeyGroup) -> Response:
    """The key group's raw stream, whole; 404 `key_not_found` when it holds none (the client reads
    that as an empty stream, as Flink's raw keyed input of such a key group is)."""
    stream = await in_transaction(job, lambda tx: tx.raw_keyed.get(key_group), OFF_LOOP)
    if stream is None:
        raise ApiError("key_not_found", f"key group {key_group} of job {job.name!r} holds no raw stream")
    return Response(stream, media_type=routes.OCTET_STREAM)


@router.put(
    routes.RAW_KEY_GROUP, status_code=204, responses=doc.RAW_KEYED_WRITE, openapi_extra=_body("the whole stream")
)
async def put_raw_stream(request: Request, job: JobDep, key_group: KeyGroup, epoch: Epoch = None) -> Response:
    """Replace the key group's raw stream (an empty body clears it)."""
    data = await request.body()
    await in_transaction(job, lambda tx: tx.raw_keyed.replace(key_group, data), OFF_LOOP, epoch)
    return Response(status_code=204)


@router.post(
    routes.RAW_KEY_GROUP_APPEND, responses=doc.RAW_KEYED_APPEND, openapi_extra=_body("the part to append to the stream")
)
async def append_raw_stream(request: Request, job: JobDep, key_group: KeyGroup, epoch: Epoch = None) -> Response:
    """Append a part to the key group's raw stream; answers the stream's new `length`."""
    data = await request.body()
    length = await in_transaction(job, lambda tx: tx.raw_keyed.append(key_group, data), OFF_LOOP, epoch)
    return render(request, {"length": length})


@router.delete(routes.RAW_KEY_GROUP, status_code=204, responses=doc.RAW_KEYED_CLEAR)
async def clear_raw_stream(job: JobDep, key_group: KeyGroup, epoch: Epoch = None) -> Response:
    await in_transaction(job, lambda tx: tx.raw_keyed.clear(key_group), epoch=epoch)
    return Response(status_code=204)


@router.get(routes.OPERATOR_RAW, responses=doc.RAW_OPERATOR_READ)
async def get_raw_partitions(request: Request, job: JobDep, operator: str, index: Index) -> Response:
    """The subtask's raw partitions in order, `{"partitions": [...]}`: bytes in msgpack
    (`Accept: application/msgpack`), base64 in JSON; 404 `key_not_found` when it holds none."""
    partitions = await in_transaction(job, lambda tx: tx.raw_operator.partitions(operator, index), OFF_LOOP)
    if not partitions:
        raise ApiError("key_not_found", f"operator {operator!r} subtask {index} holds no raw partitions")
    return render(request, {"partitions": partitions})


@router.put(
    routes.OPERATOR_RAW, status_code=204, responses=doc.RAW_OPERATOR_REPLACE, openapi_extra=doc.RAW_PARTITIONS_BODY
)
async def put_raw_partitions(
    request: Request, job: JobDep, operator: str, index: Index, epoch: Epoch = None
) -> Response:
    """Replace the subtask's raw partitions, atomically: `{"partitions": [...]}`, bin values in
    msgpack, base64 strings in JSON (as the reads answer them); an empty list clears them."""
    body = await read_body(request)
    partitions = body.get("partitions") if isinstance(body, dict) else None
    if not isinstance(partitions, list) or set(body) != {"partitions"}:
        raise ApiError("invalid_argument", 'the body must be {"partitions": [...]}, nothing else')
    if not is_msgpack(request.headers.get("content-type")):
        partitions = [from_base64(p, f"partition {i}") for i, p in enumerate(partitions)]
    await in_transaction(job, lambda tx: tx.raw_operator.replace(operator, index, partitions), OFF_LOOP, epoch)
    return Response(status_code=204)


@router.post(
    routes.OPERATOR_RAW_PARTITIONS,
    status_code=204,
    responses=doc.RAW_OPERATOR_WRITE,
    openapi_extra=_body("one partition, appended after the subtask's others"),
)
async def add_raw_partition(
    request: Request, job: JobDep, operator: str, index: Index, epoch: Epoch = None
) -> Response:
    """Append one partition (the body) to the subtask's raw operator state."""
    data = await request.body()
    await in_transaction(job, lambda tx: tx.raw_operator.add(operator, index, [data]), OFF_LOOP, epoch)
    return Response(status_code=204)


@router.delete(routes.OPERATOR_RAW, status_code=204, responses=doc.RAW_OPERATOR_CLEAR)
async def clear_raw_partitions(job: JobDep, operator: str, index: Index, epoch: Epoch = None) -> Response:
    await in_transaction(job, lambda tx: tx.raw_operator.clear(operator, index), epoch=epoch)
    return Response(status_code=204)
