"""A keyed state's stored values as Arrow: the type of a descriptor's value (what typed columns
answer), a read's rows as a table, and how a stored record reads by Flink's TTL rule. Shared by
the server's columnar reads and scans (``backends/columns.py``, ``backends/scan.py``) and by a
checkpoint reader without a server (the Spark data source's ``option("checkpoint", ...)``), so a
state reads the same from live replicas and from a checkpoint.

Scan rows: ``key`` (the key type's Arrow type), ``ns``, ``user_key`` (map states: one row per
entry), ``value``, ``key_group`` (int32) and, for TTL states, ``expires_at`` (int64 ms; a list
state's, one per element). ``value`` has the descriptor's Arrow type (:func:`value_type`); an
untyped state's values are JSON text, since their Arrow type could differ from page to page.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from statehouse.protocol.errors import StateError
from statehouse.snapshots.stored.codec import (
    decode_primary,
    decode_user_key,
    decode_value,
    iter_timestamped,
    iter_values,
    split_timestamped,
)
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.ttl import expiration_timestamp, is_expired
from statehouse.snapshots.stored.value_types import result_type

KEY_TYPES: dict[str, pa.DataType] = {"string": pa.string(), "int": pa.int32(), "long": pa.int64()}
ARROW_TYPES: dict[str, pa.DataType] = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "bool": pa.bool_(),
}


class UntypedValues(StateError):
    """An untyped state whose values have no one Arrow type (e.g. ints beside strings)."""

    code = "untyped_values"


def value_type(descriptor: StateDescriptor, op: str) -> pa.DataType | None:
    """The Arrow type of what ``op`` reads from the state, ``None`` when it is not typed."""
    kind, function = descriptor.kind, descriptor.function
    scalar = result_type(descriptor.value_type, kind, function)
    if scalar == "summary":
        number = ARROW_TYPES[descriptor.value_type or "float64"]
        return pa.struct(
            [("count", pa.int64()), ("sum", number), ("min", number), ("max", number), ("avg", pa.float64())]
        )
    arrow = ARROW_TYPES.get(scalar) if scalar is not None else None
    if op == "get" and kind == "list":
        return pa.list_(arrow) if arrow is not None else None
    if op == "get" and kind == "map":
        return pa.map_(pa.string(), arrow) if arrow is not None else None
    return arrow


def to_arrow(values: list[Any], descriptor: StateDescriptor, op: str) -> pa.Array:
    """Read values as one Arrow column: the state's type, else what Arrow infers."""
    arrow = value_type(descriptor, op)
    if arrow is None and op == "get" and descriptor.kind == "map":
        entries = _infer([v for m in values if m for v in m.values()], descriptor)
        arrow = pa.map_(pa.string(), entries.type)
    if arrow is None:
        return _infer(values, descriptor)
    numbers = _NUMPY_TYPES.get(arrow)
    if numbers is not None and set(map(type, values)) <= numbers[1]:
        with contextlib.suppress(OverflowError):  # an int beyond int64: refused below, as pyarrow refuses it
            return _numbers(values, numbers[0])
    try:
        return pa.array(values, type=arrow)
    except (pa.ArrowException, OverflowError, TypeError) as exc:  # stored before the state was typed
        raise UntypedValues(f"values of state {descriptor.name!r} do not fit {arrow}: {exc}") from None


# Numeric columns go through numpy: pyarrow builds float64 from a list ~5x slower than numpy does.
_NUMPY_TYPES: dict[pa.DataType, tuple[type, frozenset[type]]] = {
    pa.float64(): (np.float64, frozenset({float, type(None)})),
    pa.int64(): (np.int64, frozenset({int, type(None)})),
}


def _numbers(values: list[Any], dtype: type) -> pa.Array:
    """A numeric column from Python numbers (``None`` as null)."""
    if None not in values:
        return pa.array(np.array(values, dtype=dtype))
    absent = np.zeros(len(values), dtype=bool)
    absent[[i for i, v in enumerate(values) if v is None]] = True
    return pa.array(np.array([0 if v is None else v for v in values], dtype=dtype), mask=absent)


def _infer(values: list[Any], descriptor: StateDescriptor) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowException, OverflowError, TypeError) as exc:
        raise UntypedValues(
            f"the values read from state {descriptor.name!r} have no one Arrow type ({exc}); register the state with "
            "a 'value_type', or read it per operation"
        ) from None


def schema(descriptor: StateDescriptor) -> pa.Schema:
    """The columns every page of this state has (also an empty one)."""
    fields = [pa.field("key", KEY_TYPES[descriptor.key_type]), pa.field("ns", pa.string())]
    if descriptor.kind == "map":
        fields.append(pa.field("user_key", pa.string()))
    fields += [pa.field("value", _value_type(descriptor)), pa.field("key_group", pa.int32())]
    if descriptor.ttl is not None:
        expiry = pa.list_(pa.int64()) if descriptor.kind == "list" else pa.int64()
        fields.append(pa.field("expires_at", expiry))
    return pa.schema(fields)


def read_op(descriptor: StateDescriptor) -> str:
    return "map_get" if descriptor.kind == "map" else "get"


def _value_type(descriptor: StateDescriptor) -> pa.DataType:
    typed = value_type(descriptor, read_op(descriptor))
    return typed if typed is not None else pa.string()


# A row read: key group, primary, secondary (a map's user key), value, expiry (TTL states).
Row = tuple[int, bytes, bytes, Any, Any]


def rows_table(descriptor: StateDescriptor, rows: Sequence[Row]) -> pa.Table:
    """Rows read (values as :func:`decode_record` gives them) as a table of :func:`schema`."""
    keys, namespaces = [], []
    for _kg, primary, _s, _v, _e in rows:
        key, ns = decode_primary(primary, descriptor.key_type)
        keys.append(key)
        namespaces.append(ns)
    values = [row[3] for row in rows]
    if descriptor.kind in ("reducing", "aggregating"):
        result = descriptor.state_function.result
        values = [result(v) for v in values]
    columns: dict[str, pa.Array] = {
        "key": pa.array(keys, KEY_TYPES[descriptor.key_type]),
        "ns": pa.array(namespaces, pa.string()),
    }
    if descriptor.kind == "map":
        columns["user_key"] = pa.array([decode_user_key(row[2]) for row in rows], pa.string())
    if value_type(descriptor, read_op(descriptor)) is None:
        columns["value"] = pa.array([json_text(v) for v in values], pa.string())
    else:
        columns["value"] = to_arrow(values, descriptor, read_op(descriptor))
    columns["key_group"] = pa.array([row[0] for row in rows], pa.int32())
    full = schema(descriptor)
    if descriptor.ttl is not None:
        columns["expires_at"] = pa.array([row[4] for row in rows], full.field("expires_at").type)
    return pa.Table.from_pydict(columns, schema=full)


def decode_record(kind: str, ttl: Any, raw: bytes, now: int) -> tuple[Any, Any] | None:
    """A stored record's value and expiry by Flink's read rule (``None``: not visible)."""
    if ttl is None:
        return (list(iter_values(raw)), None) if kind == "list" else (decode_value(raw), None)
    if kind == "list":
        stored = list(iter_timestamped(raw))
        if not ttl.return_expired:
            stored = [(ts, v) for ts, v in stored if not is_expired(ts, ttl.ttl_ms, now)]
        if not stored:
            return None
        return [v for _ts, v in stored], [expiration_timestamp(ts, ttl.ttl_ms) for ts, _v in stored]
    timestamp, payload = split_timestamped(raw)
    if is_expired(timestamp, ttl.ttl_ms, now) and not ttl.return_expired:
        return None
    return decode_value(payload), expiration_timestamp(timestamp, ttl.ttl_ms)


def json_text(value: Any) -> str:
    return orjson.dumps(value, default=_bytes_as_base64, option=orjson.OPT_NON_STR_KEYS).decode()


def _bytes_as_base64(value: Any) -> Any:
    # JSON has no bytes: as the JSON API answers them.
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
