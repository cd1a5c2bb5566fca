"""The ranges of the integers the engine takes besides keys and values: writer epochs,
checkpoint ids, Spark partitions and request numbers. Each is stored, compared and rendered as
a 64-bit integer (Flink's checkpoint ids and Spark's ids are Java longs and ints), so one past
its range would be taken once and then fail everywhere it is read back; the engine and the
HTTP models take their bounds from here."""

from __future__ import annotations

from typing import Any

from statehouse.backends.errors import InvalidArgument
from statehouse.keygroups import INT64_MAX

MAX_EPOCH = INT64_MAX
MAX_CHECKPOINT_ID = INT64_MAX
MAX_PARTITION = 2**31 - 1  # Spark partition ids are Java ints
MAX_SEQ = INT64_MAX  # a task attempt's request number, and the write operations it staged


def check_range(value: Any, what: str, upper: int, lower: int = 0) -> int:
    """``value`` if it is an integer in ``[lower, upper]``, else ``invalid_argument`` naming the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not lower <= value <= upper:
        raise InvalidArgument(f"'{what}' must be an integer in [{lower}, {upper}]; got {value!r}")
    return value
