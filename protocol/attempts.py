"""A Spark task attempt on the wire: the fields a request names it by (``partition``, ``attempt``,
``seq``, beside the writer ``epoch``), the form of its id and of its unit (one state update of a
task), and reading them from a request, whatever door it came in by (a batch's body, a columnar
request's query). The client sends what this says (``client/attempts.py``); the engine checks
the values' ranges (``backends/staging.py``, ``AttemptRef``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from statehouse.protocol.errors import InvalidArgument

# The fields that name a task attempt; a request naming any of them is a task attempt's.
ATTEMPT_FIELDS = ("partition", "attempt", "seq")
ATTEMPT_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
UNIT_PATTERN = r"^[A-Za-z0-9._:-]{0,128}$"
_ATTEMPT_ID = re.compile(ATTEMPT_PATTERN[1:-1])  # fullmatch: "$" would also match before a final newline
_UNIT = re.compile(UNIT_PATTERN[1:-1])


def check_attempt_id(value: Any) -> str:
    """``value`` if it is an attempt id (1-128 characters of ``A-Z a-z 0-9 . _ : -``), else ``invalid_argument``."""
    if not isinstance(value, str) or not _ATTEMPT_ID.fullmatch(value):
        raise InvalidArgument(f"'attempt' must be 1-128 characters of A-Z a-z 0-9 . _ : -; got {value!r}")
    return value


def check_unit(value: Any) -> str:
    """``value`` if it is a unit (0-128 characters of ``A-Z a-z 0-9 . _ : -``), else ``invalid_argument``."""
    if not isinstance(value, str) or not _UNIT.fullmatch(value):
        raise InvalidArgument(f"'unit' must be 0-128 characters of A-Z a-z 0-9 . _ : -; got {value!r}")
    return value


def named_attempt(fields: Mapping[str, Any]) -> tuple[Any, Any, Any] | None:
    """The ``(partition, attempt, seq)`` a request names (its body, or its query parameters already
    decoded), a missing one as ``None``; ``None`` when it names none of them (no task attempt's)."""
    if not any(name in fields for name in ATTEMPT_FIELDS):
        return None
    return fields.get("partition"), fields.get("attempt"), fields.get("seq")
