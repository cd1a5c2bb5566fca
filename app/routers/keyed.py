"""Keyed state, one operation per request (the batch endpoint does many)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Request, Response
from starlette.concurrency import run_in_threadpool

from statehouse.app import openapi as doc
from statehouse.app.dependencies import JobDep, ServiceDep
from statehouse.app.models import AddBody, EntryPage, KeyItem, KeyPage, ValueBody, ValueResponse
from statehouse.app.offload import OFF_LOOP, dispatch
from statehouse.app.paging import PageDep
from statehouse.app.problems import ApiError
from statehouse.app.routing import api_router
from statehouse.app.wire import render
from statehouse.backends import ops
from statehouse.backends.job import Job
from statehouse.protocol import routes
from statehouse.protocol.errors import InvalidKey
from statehouse.snapshots.stored import codec

router = api_router(tags=["keyed state"])

Namespace = Annotated[str, Query(description="namespace (Flink's VoidNamespace is the default, '')")]

# A whole read of these kinds costs what the key holds (a map's entries, a list's elements), so
# it runs in a worker thread and the event loop keeps serving (/healthz too); other one-key
# operations are a few microseconds, less than the hop to a thread, and stay on the loop.
LONG_READS = frozenset({"map", "list"})


def parse_key(job: Job, state: str, key: str) -> str | int:
    """Path keys are text; int and long states take their canonical decimal form."""
    try:
        return codec.parse_key(key, job.descriptor(state).key_type)
    except InvalidKey as exc:
        raise exc.within(f"state {state!r}") from None


def apply_op(service: ServiceDep, job: Job, op: dict[str, Any]) -> dict[str, Any]:
    op["key"] = parse_key(job, op["state"], op["key"])
    with job.transaction() as tx:
        result = ops.apply(tx, op)
    service.metrics.state_ops.labels(job.descriptor(op["state"]).kind, op["op"]).inc()
    return result


async def run_op(service: ServiceDep, job: Job, op: dict[str, Any]) -> dict[str, Any]:
    """One operation, off the event loop if the job is busy (see ``dispatch``)."""
    return await dispatch(job, lambda: apply_op(service, job, op))


def found(request: Request, result: dict[str, Any], what: str) -> Response:
    """The value as JSON (bytes as base64) or msgpack per Accept; 404 when absent."""
    if result["value"] is None:
        raise ApiError("key_not_found", f"{what} has no value")
    return render(request, result)


@router.get(routes.KEY, response_model=ValueResponse, responses=doc.KEYED_READ)
async def get_key(
    request: Request, service: ServiceDep, job: JobDep, state: str, key: str, ns: Namespace = ""
) -> Response:
    """Read: the value, the list, the whole map, or the reduced / aggregated result."""

    def read() -> Response:
        result = apply_op(service, job, {"op": "get", "state": state, "key": key, "ns": ns})
        return found(request, result, f"key {key!r} (namespace {ns!r}) of state {state!r}")

    return await dispatch(job, read, OFF_LOOP if job.descriptor(state).kind in LONG_READS else 1)


@router.put(routes.KEY, status_code=204, responses=doc.KEYED_WRITE)
async def put_key(
    service: ServiceDep, job: JobDep, state: str, key: str, body: ValueBody, ns: Namespace = ""
) -> Response:
    """Update: value state sets it (null clears); list state replaces the list; map state replaces the map."""
    await run_op(service, job, {"op": "put", "state": state, "key": key, "ns": ns, "value": body.value})
    return Response(status_code=204)


@router.post(routes.KEY_ADD, status_code=204, responses=doc.KEYED_WRITE)
async def add_to_key(
    service: ServiceDep, job: JobDep, state: str, key: str, body: AddBody, ns: Namespace = ""
) -> Response:
    """List add / addAll, or reducing / aggregating add."""
    await run_op(service, job, {"op": "add", "state": state, "key": key, "ns": ns, **body.as_op()})
    return Response(status_code=204)


@router.post(routes.KEY_ADD_GET, response_model=ValueResponse, responses=doc.KEYED_ADD_GET)
async def add_get_key(
    request: Request, service: ServiceDep, job: JobDep, state: str, key: str, body: AddBody, ns: Namespace = ""
) -> Response:
    """Reducing / aggregating add, answering the result after it (Redis's INCRBY): an add and a
    get in one request and one lookup."""
    result = await run_op(service, job, {"op": "add_get", "state": state, "key": key, "ns": ns, **body.as_op()})
    return render(request, result)


@router.delete(routes.KEY, status_code=204, responses=doc.KEYED_CLEAR)
async def clear_key(service: ServiceDep, job: JobDep, state: str, key: str, ns: Namespace = "") -> Response:
    await run_op(service, job, {"op": "clear", "state": state, "key": key, "ns": ns})
    return Response(status_code=204)


@router.get(routes.ENTRY, response_model=ValueResponse, responses=doc.MAP_READ)
async def get_entry(
    request: Request, service: ServiceDep, job: JobDep, state: str, key: str, user_key: str, ns: Namespace = ""
) -> Response:
    result = await run_op(service, job, {"op": "map_get", "state": state, "key": key, "ns": ns, "user_key": user_key})
    return found(request, result, f"entry {user_key!r} of key {key!r} (namespace {ns!r}) of state {state!r}")


@router.put(routes.ENTRY, status_code=204, responses=doc.KEYED_WRITE)
async def put_entry(
    service: ServiceDep, job: JobDep, state: str, key: str, user_key: str, body: ValueBody, ns: Namespace = ""
) -> Response:
    op = {"op": "map_put", "state": state, "key": key, "ns": ns, "user_key": user_key, "value": body.value}
    await run_op(service, job, op)
    return Response(status_code=204)


@router.post(routes.ENTRY_ADD, status_code=204, responses=doc.KEYED_WRITE)
async def add_to_entry(
    service: ServiceDep, job: JobDep, state: str, key: str, user_key: str, body: AddBody, ns: Namespace = ""
) -> Response:
    """Fold a value (or several) into one map entry with the map's `function`, atomically on the
    server: a per-user-key reducing state. A map registered without `function` answers 409."""
    op = {"op": "map_add", "state": state, "key": key, "ns": ns, "user_key": user_key, **body.as_op()}
    await run_op(service, job, op)
    return Response(status_code=204)


@router.delete(routes.ENTRY, status_code=204, responses=doc.MAP_REMOVE)
async def remove_entry(
    service: ServiceDep, job: JobDep, state: str, key: str, user_key: str, ns: Namespace = ""
) -> Response:
    await run_op(service, job, {"op": "map_remove", "state": state, "key": key, "ns": ns, "user_key": user_key})
    return Response(status_code=204)


@router.get(routes.ENTRIES, response_model=EntryPage, responses=doc.MAP_LIST)
async def list_entries(
    request: Request,
    job: JobDep,
    state: str,
    key: str,
    paging: PageDep,
    ns: Namespace = "",
) -> Response:
    """Map iteration in user-key order, paged: each page seeks to its cursor. A page may hold
    fewer than `limit` entries (expired ones are skipped); only `next_cursor: null` ends."""

    def page() -> Response:
        parsed = parse_key(job, state, key)
        with job.transaction() as tx:
            found = tx.map(state).entries_page(parsed, ns, paging.after, paging.limit)
        items = [{"key": k, "value": v} for k, v in found.entries]
        return render(request, {"items": items, "next_cursor": paging.cursor_at(found.next_after)})

    return await run_in_threadpool(page)


@router.get(routes.STATE_KEYS, response_model=KeyPage, responses=doc.LIST_KEYS)
async def list_keys(
    job: JobDep,
    state: str,
    paging: PageDep,
    ns: Namespace = "",
    key_group: Annotated[int | None, Query(ge=0, description="only this key group")] = None,
) -> KeyPage:
    """Keys of a state in one namespace, in key-group order, paged; optionally one key group only."""

    def page() -> KeyPage:
        found, next_after = job.keys_page(state, ns, key_group, paging.after, paging.limit)
        items = [KeyItem(key=k.key, key_group=k.key_group, ns=k.namespace) for k in found]
        return KeyPage(items=items, next_cursor=paging.cursor_at(next_after))

    return await run_in_threadpool(page)
