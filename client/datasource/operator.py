"""Operator state as rows, the same whether read from the live replicas or from a checkpoint: one
row per list element and per broadcast entry, the value as JSON text (operator state declares no
value type)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pyarrow as pa

OPERATOR_SCHEMA = pa.schema(
    [
        pa.field("state", pa.string()),
        pa.field("mode", pa.string()),  # split, union (list states) or broadcast
        pa.field("subtask", pa.int32()),  # list states: the subtask holding the list; broadcast: null
        pa.field("position", pa.int32()),  # list states: the element's place in its list; broadcast: null
        pa.field("key", pa.string()),  # broadcast: the entry's key; list states: null
        pa.field("value", pa.string()),  # JSON text
    ]
)


def json_text(value: Any) -> str:
    """A value as the JSON API answers it (bytes as base64), as text."""
    return json.dumps(value, default=_bytes_as_base64)


def _bytes_as_base64(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def list_rows(name: str, mode: str, subtask: int, values: list[Any]) -> pa.RecordBatch:
    rows = [
        {"state": name, "mode": mode, "subtask": subtask, "position": i, "value": json_text(v)}
        for i, v in enumerate(values)
    ]
    return pa.RecordBatch.from_pylist(rows, schema=OPERATOR_SCHEMA)


def broadcast_rows(name: str, entries: list[tuple[str, Any]]) -> pa.RecordBatch:
    rows = [{"state": name, "mode": "broadcast", "key": k, "value": json_text(v)} for k, v in entries]
    return pa.RecordBatch.from_pylist(rows, schema=OPERATOR_SCHEMA)
