"""Exceptions raised by the client, mapped from the server's problem+json responses."""

from __future__ import annotations

import json
from typing import Any


class StatehouseError(Exception):
    """An error answer from Statehouse (or no answer at all)."""

    def __init__(self, detail: str, *, status: int | None = None, code: str | None = None, problem: Any = None):
        super().__init__(f"{code}: {detail}" if code else detail)
        self.detail = detail
        self.status = status
        self.code = code
        self.problem = problem if isinstance(problem, dict) else {}


class InvalidRequest(StatehouseError):
    """400, 413, 415, 422: the request must change before it can succeed."""


class Unauthorized(StatehouseError):
    """401: missing or wrong bearer token."""


class Forbidden(StatehouseError):
    """403 ``forbidden``: the token is valid but not scoped to this job (or this restore location).
    Not retried: another token is needed."""


class NotFound(StatehouseError):
    """404: no such job, state, key or checkpoint."""


class Conflict(StatehouseError):
    """409: e.g. an incompatible descriptor, a wrong state kind, a checkpoint id in use."""


class StaleEpoch(Conflict):
    """409 ``stale_epoch``: this writer was fenced off by a newer attempt."""


class KeyNotOwned(StatehouseError):
    """421: the key belongs to another replica (the client's replica list is misordered)."""

    @property
    def owner(self) -> int | None:
        return self.problem.get("owner")


class LayoutError(StatehouseError):
    """The client's replicas are not one complete, consistent replica set (a replica missing or
    unreachable, two at one index, replicas of different sets or topology versions); the message
    says what to fix. Raised by the client itself, not answered by a server."""


class Unavailable(StatehouseError):
    """503 or a transport failure: worth retrying later."""


_BY_STATUS: dict[int, type[StatehouseError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: InvalidRequest,
    415: InvalidRequest,
    421: KeyNotOwned,
    422: InvalidRequest,
    503: Unavailable,
}


def error_from_response(status: int, content: bytes, reason: str = "") -> StatehouseError:
    """The exception for an error answer, from its problem+json body when it has one."""
    try:
        problem = json.loads(content)
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    code = problem.get("code")
    detail = problem.get("detail") or content[:500].decode("utf-8", "replace") or reason or f"HTTP {status}"
    cls = StaleEpoch if code == "stale_epoch" else _BY_STATUS.get(status, StatehouseError)
    return cls(detail, status=status, code=code, problem=problem)
