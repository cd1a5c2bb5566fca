"""What every columnar endpoint (states, timers) reads first: the Arrow IPC body, parsed into the
endpoint's operation, and the task attempt and writer epoch its query parameters name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson
import pyarrow as pa
from fastapi import Request, Response

from statehouse.app.dependencies import Service
from statehouse.app.problems import ApiError
from statehouse.app.wire import JSON, read_arrow
from statehouse.backends.bounds import MAX_EPOCH, MAX_PARTITION, MAX_SEQ
from statehouse.backends.staging import AttemptRef
from statehouse.protocol.attempts import ATTEMPT_FIELDS, ATTEMPT_PATTERN
from statehouse.snapshots.stored.codec import parse_decimal
from statehouse.snapshots.stored.names import NAME_PATTERN

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


_NAME = NAME_PATTERN[1:-1]
STATES_PARAMETER = {
    **_query(
        "states",
        "the states, comma-separated, in the order they apply (`POST /v1/jobs/{job}/columns/{op}`)",
        {"type": "string", "pattern": f"^{_NAME}(,{_NAME})*$"},
    ),
    "required": True,
}


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
    fields: dict[str, Any] = {}
    for name in ATTEMPT_FIELDS:  # in this order, as the query's errors are reported
        if name in request.query_params:
            fields[name] = request.query_params[name] if name == "attempt" else query_count(request, name)
    return AttemptRef.named_in(fields)


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
    if not request.scope.get("query_string"):  # no attempt, no epoch: nothing to parse
        return ColumnarRequest(work, len(raw), None, None)
    return ColumnarRequest(work, len(raw), request_attempt(request), query_count(request, "epoch"))
