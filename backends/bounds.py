"""Checking the integers the engine takes besides keys and values against their ranges (writer
epochs, checkpoint ids, Spark partitions, request numbers: defined in ``protocol.bounds``,
which the client shares)."""

from __future__ import annotations

from typing import Any

from statehouse.protocol.bounds import MAX_CHECKPOINT_ID, MAX_EPOCH, MAX_PARTITION, MAX_SEQ
from statehouse.protocol.errors import InvalidArgument

__all__ = ["MAX_CHECKPOINT_ID", "MAX_EPOCH", "MAX_PARTITION", "MAX_SEQ", "check_range"]


def check_range(value: Any, what: str, upper: int, lower: int = 0) -> int:
    """``value`` if it is an integer in ``[lower, upper]``, else ``invalid_argument`` naming the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not lower <= value <= upper:
        raise InvalidArgument(f"'{what}' must be an integer in [{lower}, {upper}]; got {value!r}")
    return value
