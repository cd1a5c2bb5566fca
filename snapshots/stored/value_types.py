"""Optional value types of keyed states: what values a state takes and what type it reads back.

A state registered with ``value_type`` refuses values of other types on every path (per
operation and columnar), so its values come back as one typed column (a sum of doubles is a
float64 column, not msgpack bytes). Without one a state takes any value msgpack stores. Stored
bytes are msgpack either way (one storage format).

For value, list and map states the type is that of the values (list elements, map entries);
for reducing and aggregating states it is that of the values added, and what a read returns
follows from the function (``count`` is int64, ``avg`` float64, ``summary`` a struct).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

from statehouse.protocol.errors import InvalidArgument, InvalidValue
from statehouse.protocol.keygroups import INT64_MAX, INT64_MIN

ValueType = Literal["int64", "float64", "string", "binary", "bool"]
VALUE_TYPES: tuple[ValueType, ...] = ("int64", "float64", "string", "binary", "bool")
NUMERIC: tuple[ValueType, ...] = ("int64", "float64")

# Functions that add numbers, and those whose result is always a count.
_NUMERIC_FUNCTIONS = frozenset({"sum", "avg", "summary"})
_COUNTING_FUNCTIONS = frozenset({"count"})


def _int64(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValue(f"this state holds int64 values; got {type(value).__name__} {value!r}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidValue(f"{value} does not fit int64")
    return value


def _float64(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidValue(f"this state holds float64 values; got {type(value).__name__} {value!r}")
    try:
        number = float(value)
    except OverflowError:
        raise InvalidValue(f"{value} does not fit float64") from None
    if not math.isfinite(number):
        raise InvalidValue(f"this state holds finite float64 values; got {value!r}")
    return number


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidValue(f"this state holds string values; got {type(value).__name__} {value!r}")
    return value


def _binary(value: Any) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidValue(
            f"this state holds binary values; got {type(value).__name__} {value!r} (send bytes as msgpack or Arrow)"
        )
    return bytes(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidValue(f"this state holds bool values; got {type(value).__name__} {value!r}")
    return value


COERCE: dict[ValueType, Callable[[Any], Any]] = {
    "int64": _int64,
    "float64": _float64,
    "string": _string,
    "binary": _binary,
    "bool": _bool,
}


# The Python types a value of each type decodes to: values all of these pass unchanged.
_EXACT: dict[ValueType, frozenset[type]] = {
    "int64": frozenset({int}),
    "float64": frozenset({float}),
    "string": frozenset({str}),
    "binary": frozenset({bytes}),
    "bool": frozenset({bool}),
}
_NONE = type(None)


def coerce_many(value_type: ValueType, values: list[Any]) -> list[Any] | None:
    """The values unchanged when every one already is ``value_type`` (``None`` aside), else
    ``None``: then check them one by one. A column from Arrow takes this path in C loops."""
    kinds = set(map(type, values))
    kinds.discard(_NONE)
    if not kinds <= _EXACT[value_type]:
        return None
    if kinds and value_type in NUMERIC:
        present = [v for v in values if v is not None] if _NONE in set(map(type, values)) else values
        if value_type == "int64" and not INT64_MIN <= min(present) <= max(present) <= INT64_MAX:
            return None
        if value_type == "float64" and not all(map(math.isfinite, present)):
            return None
    return values


def check_value_type(value_type: Any, kind: str, function: str | None) -> None:
    """Refuse a value type that the state's kind and function cannot hold (at registration)."""
    if value_type is None:
        return
    if value_type not in VALUE_TYPES:
        raise InvalidArgument(f"value_type must be one of {', '.join(VALUE_TYPES)}; got {value_type!r}")
    if function in _NUMERIC_FUNCTIONS and value_type not in NUMERIC:
        raise InvalidArgument(f"function {function!r} adds numbers: value_type must be int64 or float64")
    if kind == "map" and function in _COUNTING_FUNCTIONS and value_type != "int64":
        raise InvalidArgument("a map that counts into its entries holds int64 values: value_type must be int64")
    if function in ("min", "max") and value_type in ("binary", "bool"):
        raise InvalidArgument(f"function {function!r} compares numbers or strings: value_type cannot be {value_type}")


def result_type(value_type: ValueType | None, kind: str, function: str | None) -> ValueType | Literal["summary"] | None:
    """The type a read of the state returns per value (list / map: per element or entry)."""
    if kind in ("value", "list", "map") or function is None:
        return value_type
    if function == "count":
        return "int64"
    if function == "avg":
        return "float64"
    if function == "summary":
        return "summary"
    return value_type
