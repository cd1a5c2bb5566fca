"""A keyed state as a table: its rows per key-group sub-range, as Arrow IPC pages (``backends/scan.py``)."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any

from fastapi import Query, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from statehouse.app import openapi as doc
from statehouse.app.dependencies import JobDep, ServiceDep
from statehouse.app.paging import decode_cursor, encode_cursor
from statehouse.app.problems import ApiError
from statehouse.app.routing import api_router
from statehouse.app.wire import arrow_response
from statehouse.backends.scan import Position, scan, sizes
from statehouse.protocol.routes import MAX_SCAN_KEYS, NEXT_CURSOR, STATE_SCAN, STATE_SIZES
from statehouse.snapshots.stored import codec

router = api_router(tags=["keyed state"])

MAX_ROWS = 100_000  # rows per page, at most (the stored bytes bound a page too)
# A query string carries text: one `key=...` is one key whatever it spells (`key=false` is the
# key "false"), and the parameter repeated is several. The schema says so (an array, or one
# string; FastAPI's `anyOf [array, null]` forbade the one string), so that what the document
# forbids the route refuses. More than MAX_SCAN_KEYS keys are refused 422 (not `maxItems`: such a query
# string usually meets the request head's limit first, a 431).
KEY_SCHEMA: dict[str, Any] = {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]}
FirstKeyGroup = Annotated[int | None, Query(ge=0, description="first key group (default: this replica's first)")]
LastKeyGroup = Annotated[
    int | None, Query(ge=0, description="last key group, inclusive (default: this replica's last)")
]

SCAN = {
    200: {
        "description": "the page's rows as an Arrow IPC stream (`key`, `ns`, `user_key` for map states, `value`, "
        "`key_group`, `expires_at` for TTL states); the stream's schema metadata `statehouse.next_cursor`, when "
        "present, is the `cursor` of the next page",
        "content": {doc.ARROW_STREAM: {"schema": doc.ARROW_SCHEMA}},
    },
    # 431: keys are sent in the query string, which the request head's limit bounds.
    **doc.errors(*doc.JOB, "state_not_found", "invalid_argument", "invalid_key", "untyped_values", "header_too_large"),
}


class KeyGroupSize(BaseModel):
    key_group: int
    entries: int
    bytes: int


class StateSizes(BaseModel):
    state: str
    key_groups: list[KeyGroupSize]


@router.get(STATE_SCAN, response_class=Response, responses=SCAN)
async def scan_state(
    service: ServiceDep,
    job: JobDep,
    state: str,
    key_group_start: FirstKeyGroup = None,
    key_group_end: LastKeyGroup = None,
    key: Annotated[
        list[str] | None,
        Query(
            description=f"only these keys (every namespace; int and long keys in decimal), at most {MAX_SCAN_KEYS}: "
            "the parameter once per key",
            json_schema_extra=KEY_SCHEMA,
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_ROWS, description="most rows in the page")] = 10_000,
    max_bytes: Annotated[
        int | None, Query(ge=1, description="most stored bytes the page reads (capped at STATEHOUSE_MAX_ANSWER_BYTES)")
    ] = None,
    cursor: Annotated[
        str | None, Query(description="statehouse.next_cursor of the previous page", json_schema_extra={"minLength": 1})
    ] = None,
) -> Response:
    """Every row of a keyed state in a key-group range this replica owns (the rest of the range is
    other replicas'), in key-group order, paged: a page ends after `limit` rows or once it read
    `max_bytes` of stored data, and its schema metadata `statehouse.next_cursor` resumes it. A scan reads
    committed state without writing: expired entries are left out (or kept, per the state's TTL
    visibility) but neither cleaned up nor refreshed. With `key`, only those keys' rows."""
    groups = job.keyspace.owned_part(key_group_start, key_group_end)
    after = decode_cursor(cursor)
    position = Position.decode(after) if after is not None else None
    descriptor = job.descriptor(state)
    keys = None
    if key is not None:
        if len(key) > MAX_SCAN_KEYS:
            raise ApiError("invalid_argument", f"at most {MAX_SCAN_KEYS} keys per scan; got {len(key)}: send several")
        keys = [codec.parse_key(k, descriptor.key_type) for k in key]
    budget = min(max_bytes or service.settings.max_answer_bytes, service.settings.max_answer_bytes)

    def page() -> Response:
        found = scan(job, state, groups, after=position, keys=keys, max_rows=limit, max_bytes=budget)
        service.metrics.count_ops(Counter({(descriptor.kind, "scan"): found.table.num_rows}))
        table = found.table
        if found.next is not None:
            table = table.replace_schema_metadata({NEXT_CURSOR: encode_cursor(found.next.encode()).encode()})
        return arrow_response(table)

    return await run_in_threadpool(page)


SIZES = doc.errors(*doc.JOB, "state_not_found", "invalid_argument")


@router.get(STATE_SIZES, response_model=StateSizes, responses=SIZES)
async def state_sizes(
    job: JobDep,
    state: str,
    key_group_start: FirstKeyGroup = None,
    key_group_end: LastKeyGroup = None,
) -> StateSizes:
    """What a keyed state stores per key group this replica owns: entries (a map's entries count one
    each; expired ones not yet cleaned up included) and their stored bytes. Groups holding nothing
    are left out. It reads the whole range (one key group at a time under the job's lock)."""
    groups = job.keyspace.owned_part(key_group_start, key_group_end)
    found = await run_in_threadpool(sizes, job, state, groups)
    return StateSizes(
        state=state, key_groups=[KeyGroupSize(key_group=g.key_group, entries=g.entries, bytes=g.bytes) for g in found]
    )
