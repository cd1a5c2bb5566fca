"""Operator (non-keyed) state: list state per subtask, broadcast state per operator."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Path, Query, Request, Response
from pydantic import BeforeValidator
from starlette.concurrency import run_in_threadpool

from statehouse.app import openapi as doc
from statehouse.app.dependencies import JobDep
from statehouse.app.models import (
    AddBody,
    EntryPage,
    OperatorInfo,
    OperatorListInfo,
    OperatorListResponse,
    ValueBody,
    ValueResponse,
    canonical_index,
)
from statehouse.app.offload import in_transaction
from statehouse.app.paging import PageDep
from statehouse.app.problems import ApiError
from statehouse.app.routing import api_router
from statehouse.app.wire import render
from statehouse.backends.operator_state import operator_contents
from statehouse.backends.redistribution import MAX_SUBTASKS
from statehouse.protocol import routes

router = api_router(tags=["operator state"])

Index = Annotated[
    int,
    Path(ge=0, le=MAX_SUBTASKS - 1, description="subtask index, in canonical decimal form"),
    BeforeValidator(canonical_index),
]
Mode = Annotated[
    Literal["split", "union"] | None,
    Query(description="redistribution mode, fixed on first write: split (default) or union"),
]


@router.get(routes.OPERATOR, response_model=OperatorInfo, responses=doc.OPERATOR_READ)
async def describe_operator(job: JobDep, operator: str) -> OperatorInfo:
    """The operator's list states on this replica (name, mode, the subtasks holding elements) and
    its broadcast states' names: what to read of it."""

    def describe() -> OperatorInfo:  # walks the operator tables' keys: off the event loop
        with job.exclusive():
            lists, broadcast = operator_contents(job.partition, operator)
        return OperatorInfo(
            lists=[OperatorListInfo(name=n, mode=m, subtasks=s) for n, m, s in lists], broadcast=broadcast
        )

    return await run_in_threadpool(describe)


@router.get(routes.OPERATOR_LIST, response_model=OperatorListResponse, responses=doc.OPERATOR_LIST_READ)
async def get_list(request: Request, job: JobDep, operator: str, index: Index, name: str) -> Response:
    def read() -> Response:  # a whole list, however long: off the event loop
        with job.transaction() as tx:
            values = tx.operator.list_get(operator, index, name)
            mode = tx.operator.list_mode(operator, name)
        if values is None:
            raise ApiError("key_not_found", f"operator list state {operator}/{index}/{name} is empty")
        return render(request, {"value": values, "mode": mode})

    return await run_in_threadpool(read)


@router.put(routes.OPERATOR_LIST, status_code=204, responses=doc.OPERATOR_LIST_WRITE)
async def put_list(job: JobDep, operator: str, index: Index, name: str, body: ValueBody, mode: Mode = None) -> Response:
    """Replace the subtask's list (`{"value": [...]}`)."""
    if not isinstance(body.value, list):
        raise ApiError(
            "invalid_argument",
            f"'value' must be a list (the subtask's whole list, e.g. {{\"value\": [1, 2]}}); "
            f"got {type(body.value).__name__}",
        )
    values = body.value
    await in_transaction(
        job,
        lambda tx: tx.operator.list_update(operator, index, name, values, mode),
        len(values),
    )
    return Response(status_code=204)


@router.post(routes.OPERATOR_LIST, status_code=204, responses=doc.OPERATOR_LIST_WRITE)
async def add_to_list(
    job: JobDep, operator: str, index: Index, name: str, body: AddBody, mode: Mode = None
) -> Response:
    """Append `{"value": v}` or `{"values": [...]}`."""
    values = body.values if body.values is not None else [body.value]
    await in_transaction(
        job,
        lambda tx: tx.operator.list_add(operator, index, name, values, mode),
        len(values),
    )
    return Response(status_code=204)


@router.delete(routes.OPERATOR_LIST, status_code=204, responses=doc.OPERATOR_CLEAR)
async def clear_list(job: JobDep, operator: str, index: Index, name: str) -> Response:
    await in_transaction(job, lambda tx: tx.operator.list_clear(operator, index, name))
    return Response(status_code=204)


@router.get(routes.BROADCAST_ENTRIES, response_model=EntryPage, responses=doc.BROADCAST_LIST)
async def list_broadcast(
    request: Request,
    job: JobDep,
    operator: str,
    name: str,
    paging: PageDep,
) -> Response:
    """The operator's broadcast state `name`, its entries in key order, paged (`limit`, and the
    previous page's `next_cursor` as `cursor`); it is read whole, being small by design."""
    after = paging.after

    def page() -> Response:  # reads the whole broadcast state (kept small by design): off the event loop
        with job.transaction() as tx:
            entries = tx.operator.broadcast_entries(operator, name)
        remaining = ((k, v) for k, v in entries.items() if after is None or k.encode() > after)
        found, next_cursor = paging.take(remaining, lambda e: e[0].encode())
        return render(request, {"items": [{"key": k, "value": v} for k, v in found], "next_cursor": next_cursor})

    return await run_in_threadpool(page)


@router.get(routes.BROADCAST_ENTRY, response_model=ValueResponse, responses=doc.BROADCAST_READ)
async def get_broadcast(request: Request, job: JobDep, operator: str, name: str, key: str) -> Response:
    value = await in_transaction(job, lambda tx: tx.operator.broadcast_get(operator, name, key))
    if value is None:
        raise ApiError("key_not_found", f"broadcast state {operator}/{name} has no entry {key!r}")
    return render(request, {"value": value})


@router.put(routes.BROADCAST_ENTRY, status_code=204, responses=doc.BROADCAST_WRITE)
async def put_broadcast(job: JobDep, operator: str, name: str, key: str, body: ValueBody) -> Response:
    await in_transaction(job, lambda tx: tx.operator.broadcast_put(operator, name, key, body.value))
    return Response(status_code=204)


@router.delete(routes.BROADCAST_ENTRY, status_code=204, responses=doc.BROADCAST_REMOVE)
async def remove_broadcast(job: JobDep, operator: str, name: str, key: str) -> Response:
    await in_transaction(job, lambda tx: tx.operator.broadcast_remove(operator, name, key))
    return Response(status_code=204)
