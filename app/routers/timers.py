"""Timers: register and delete per (key, namespace, timestamp), advance a time domain and receive
the fired timers, list and count them per key group (the rules are in ``backends/timers.py``)."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, cast

from fastapi import Path, Query, Request, Response
from pydantic import BeforeValidator
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams

from statehouse.app import openapi as doc
from statehouse.app.columnar_request import ATTEMPT_PARAMETERS, read_columnar
from statehouse.app.data_plane import FastRoute, route_of
from statehouse.app.dependencies import JobDep, ServiceDep
from statehouse.app.models import (
    AdvanceBody,
    AdvanceResponse,
    ColumnsResponse,
    TimerCount,
    TimerCounts,
    TimerPage,
    canonical_index,
)
from statehouse.app.offload import OFF_LOOP, dispatch, in_transaction
from statehouse.app.paging import PageDep
from statehouse.app.routing import api_router, data_plane
from statehouse.app.wire import render
from statehouse.backends import ops
from statehouse.backends import timers as timer_service
from statehouse.backends.attempts import advance, perform
from statehouse.backends.job import Job
from statehouse.backends.staging import AttemptRef
from statehouse.backends.timer_columns import TimerColumns
from statehouse.backends.timers import TIME_DOMAINS, TimeDomain
from statehouse.protocol import routes
from statehouse.protocol.attempts import ATTEMPT_FIELDS
from statehouse.protocol.keygroups import INT64_MAX, INT64_MIN, KEY_TYPES, KeyType
from statehouse.protocol.ops import TIMER_COLUMN_OPS, TimerColumnOpName
from statehouse.snapshots.stored import codec

router = api_router(tags=["timers"])

Domain = Annotated[TimeDomain, Path(description="event (watermark) or processing (clock) time")]
Timestamp = Annotated[
    int,
    Path(ge=INT64_MIN, le=INT64_MAX, description="the timer's time in milliseconds, in canonical decimal form"),
    BeforeValidator(canonical_index),
]
KeyTypeQuery = Annotated[KeyType, Query(description="the key's type: string (default), int or long")]
Namespace = Annotated[str, Query(description="namespace (Flink's VoidNamespace is the default, '')")]
KeyGroupQuery = Annotated[int | None, Query(ge=0, description="only this key group")]


async def _write(
    service: ServiceDep, job: Job, op: str, domain: TimeDomain, key: str, key_type: KeyType, ns: str, ts: int
) -> None:
    typed = codec.parse_key(key, key_type)
    await in_transaction(
        job,
        lambda tx: ops.apply(
            tx, {"op": op, "domain": domain, "key": typed, "key_type": key_type, "ns": ns, "timestamp": ts}
        ),
    )
    service.metrics.count_ops(Counter({("timer", op): 1}))


@router.put(routes.TIMER, status_code=204, responses=doc.TIMER)
async def put_timer(
    service: ServiceDep,
    job: JobDep,
    domain: Domain,
    key: str,
    timestamp: Timestamp,
    ns: Namespace = "",
    key_type: KeyTypeQuery = "string",
) -> Response:
    """Register a timer (Flink's `registerEventTimeTimer` / `registerProcessingTimeTimer`); registering
    one that exists is a no-op (one timer per key, namespace and timestamp). A timer at or below the
    domain's current time fires on the next advance. Fenced and staged writes: the batch endpoint's
    `register_timer` operation."""
    await _write(service, job, "register_timer", domain, key, key_type, ns, timestamp)
    return Response(status_code=204)


@router.delete(routes.TIMER, status_code=204, responses=doc.TIMER)
async def delete_timer(
    service: ServiceDep,
    job: JobDep,
    domain: Domain,
    key: str,
    timestamp: Timestamp,
    ns: Namespace = "",
    key_type: KeyTypeQuery = "string",
) -> Response:
    """Delete a timer (Flink's `deleteEventTimeTimer` / `deleteProcessingTimeTimer`); an absent one is a
    no-op."""
    await _write(service, job, "delete_timer", domain, key, key_type, ns, timestamp)
    return Response(status_code=204)


@router.post(
    routes.TIMER_COLUMNS,
    response_model=ColumnsResponse,
    openapi_extra={"requestBody": doc.TIMER_COLUMNS_BODY, "parameters": ATTEMPT_PARAMETERS},
    responses=doc.TIMER_COLUMNS,
)
@data_plane
async def timer_columns(
    service: ServiceDep,
    job: JobDep,
    domain: Domain,
    op: TimerColumnOpName,
    request: Request,
    key_type: KeyTypeQuery = "string",
) -> Response:
    """Register (`register`) or delete (`delete`) one timer per row of an Arrow IPC stream: columns `key`
    (utf8, int32 or int64 as `key_type` says), `timestamp` (int64 ms) and optionally `ns`; in order and
    atomically. `epoch` fences; `partition`, `attempt` and `seq` stage the rows for a task attempt (each
    row one write), as on the columnar state endpoint."""
    read = await read_columnar(service, request, lambda table: TimerColumns.parse(op, domain, key_type, table))
    work = read.work
    await dispatch(job, lambda: perform(job, work, epoch=read.epoch, attempt=read.attempt, size=read.size), work.rows)
    service.metrics.count_ops(Counter({("timer", f"{op}_timer"): work.rows}))
    return read.written(op, work.rows)


def _takes(params: dict[str, str], query: bytes) -> bool:
    """A domain, an op and at most one ``key_type`` FastAPI accepts (else its 422 words the refusal)."""
    if params["domain"] not in TIME_DOMAINS or params["op"] not in TIMER_COLUMN_OPS:
        return False
    key_types = QueryParams(query).getlist("key_type") if b"key_type" in query else []
    return len(key_types) <= 1 and all(k in KEY_TYPES for k in key_types)


# The timers' columns without FastAPI's routing (app/data_plane.py).
FAST_ROUTES = [
    FastRoute(
        route_of(router.routes, timer_columns),
        _takes,
        lambda service, job, request, p: timer_columns(  # the values _takes checked
            service,
            job,
            cast(TimeDomain, p["domain"]),
            cast(TimerColumnOpName, p["op"]),
            request,
            cast(KeyType, request.query_params.get("key_type", "string")),
        ),
    )
]


@router.post(routes.TIMER_ADVANCE, response_model=AdvanceResponse, responses=doc.ADVANCE)
async def advance_timers(
    request: Request, service: ServiceDep, job: JobDep, domain: Domain, body: AdvanceBody
) -> Response:
    """Raise this replica's watermark (event) or clock (processing) to `to` (an older value leaves it) and
    fire every timer at or below it: answered in (timestamp, key group, key, namespace) order and deleted
    atomically. `epoch` fences as on the batch endpoint; with `partition`, `attempt` and `seq` the firing
    is staged for the task attempt (one write operation) and committed with its epoch: a retried attempt
    fires the same timers again, and only the committed attempt's firing removes them."""
    attempt = AttemptRef.named_in(body.model_dump(include=set(ATTEMPT_FIELDS), exclude_none=True))
    groups = job.keyspace.key_group_range(body.key_groups) if body.key_groups is not None else None
    cap = service.settings.max_batch_ops
    limit = min(body.limit or cap, cap)
    result = await dispatch(
        job,
        lambda: advance(job, domain, body.to, key_groups=groups, limit=limit, epoch=body.epoch, attempt=attempt),
        OFF_LOOP,
    )
    service.metrics.count_ops(Counter({("timer", "advance"): 1}))
    return render(request, result.to_dict())


@router.get(routes.TIMERS, response_model=TimerPage, responses=doc.LIST_TIMERS)
async def list_timers(
    request: Request, job: JobDep, domain: Domain, paging: PageDep, key_group: KeyGroupQuery = None
) -> Response:
    """This replica's stored timers of a domain, in key-group then firing order, paged; optionally one key
    group only."""

    def page() -> Response:
        found, next_after = timer_service.timers_page(job, domain, key_group, paging.after, paging.limit)
        return render(request, {"items": [t.to_dict() for t in found], "next_cursor": paging.cursor_at(next_after)})

    return await run_in_threadpool(page)


@router.get(routes.TIMER_COUNTS, response_model=TimerCounts, responses=doc.COUNT_TIMERS)
async def count_timers(job: JobDep, domain: Domain, key_group: KeyGroupQuery = None) -> TimerCounts:
    """How many timers of a domain this replica holds per key group, and the domain's current time here."""

    def count() -> TimerCounts:
        with job.exclusive(), job.transaction() as tx:
            counts = timer_service.count_timers(job, domain, key_group)
            time = tx.timers.current_time(domain)
        return TimerCounts(
            domain=domain,
            time=time,
            total=sum(counts.values()),
            key_groups=[TimerCount(key_group=kg, count=n) for kg, n in sorted(counts.items())],
        )

    return await run_in_threadpool(count)
