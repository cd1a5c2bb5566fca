"""The keyed-state API of a transaction, served through the columnar core instead.

``ColumnarTransaction(tx).value("v").get("k")`` builds a one-table Arrow request, runs it
with ``apply_columns`` (locate, the kinds' ``*_many`` methods, Arrow out) and reads the
answer back, so the conformance suite runs unchanged against both paths. Several-key calls
(``put_all``, ``add_all`` on reducing states) become several rows of one request.

Values that Arrow cannot type as one column (a list mixing ints and strings) cannot travel
the columnar path: the adapter checks that the columnar path refuses them with a clear
error, then does that one step per operation (counted in ``fallbacks``).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from statehouse.backends.columns import ColumnOp, UntypedValues, apply_columns
from statehouse.backends.errors import InvalidArgument, InvalidValue

_KEY_TYPES = {"string": pa.string(), "int": pa.int32(), "long": pa.int64()}


def _column(values: list[Any]) -> pa.Array | None:
    try:
        return pa.array(values)
    except (pa.ArrowException, TypeError, OverflowError):
        return None


class ColumnarState:
    def __init__(self, tx: ColumnarTransaction, state: Any) -> None:
        self._tx = tx
        self._state = state  # the per-operation state (already checked for its kind)
        self._descriptor = state.descriptor

    def _run(self, op: str, rows: list[dict[str, Any]], value_type: pa.DataType | None = None) -> list[Any]:
        keys = [r["key"] for r in rows]
        try:
            key_column = pa.array(keys, _KEY_TYPES[self._descriptor.key_type])
        except (pa.ArrowException, TypeError, OverflowError):
            key_column = _column(keys)  # a key of another type: the server must refuse the column
            if key_column is None:
                raise _NotArrow(keys) from None
        columns = {
            "key": key_column,
            "ns": pa.array([r["ns"] for r in rows], pa.string()),
        }
        if "user_key" in rows[0]:
            columns["user_key"] = pa.array([r["user_key"] for r in rows], pa.string())
        if "value" in rows[0]:
            values = [r["value"] for r in rows]
            column = pa.array(values, value_type) if value_type is not None else _column(values)
            if column is None:
                raise _NotArrow(values)
            columns["value"] = column
        result = apply_columns(self._tx.tx, ColumnOp.parse(self._descriptor.name, op, pa.table(columns)))
        if result is None:
            return []
        return [dict(v) if pa.types.is_map(result.type) and v is not None else v for v in result.to_pylist()]

    def _one(self, op: str, key: Any, ns: str, fallback: Any = None, **fields: Any) -> Any:
        try:
            answer = self._run(op, [{"key": key, "ns": ns, **fields}])
        except _NotArrow:
            return self._tx.fell_back(fallback)
        except UntypedValues:
            return self._tx.fell_back(fallback)
        return answer[0] if answer else None

    # -- every kind ---------------------------------------------------------------------------

    def get(self, key: Any, *args: Any, namespace: str = "") -> Any:
        if self._descriptor.kind == "map":
            (user_key, *rest) = args
            ns = rest[0] if rest else namespace
            return self._one("map_get", key, ns, lambda: self._state.get(key, user_key, ns), user_key=user_key)
        ns = args[0] if args else namespace
        return self._one("get", key, ns, lambda: self._state.get(key, ns))

    def clear(self, key: Any, namespace: str = "") -> None:
        self._one("clear", key, namespace)

    def update(self, key: Any, value: Any, namespace: str = "") -> None:
        ns = namespace
        if self._descriptor.kind == "map":
            entries = list(value.items())
            types = _column([v for _k, v in entries])
            if types is None:
                self._tx.fell_back(lambda: self._state.update(key, value, ns))
                return
            self._run("put", [{"key": key, "ns": ns, "value": entries}], pa.map_(pa.string(), types.type))
        elif self._descriptor.kind == "list" and not value:
            self._run("put", [{"key": key, "ns": ns, "value": []}], pa.list_(pa.int64()))
        else:
            self._one("put", key, ns, lambda: self._state.update(key, value, ns), value=value)

    # -- list, reducing, aggregating, and map_add ---------------------------------------------

    def add(self, key: Any, *args: Any, namespace: str = "") -> None:
        if self._descriptor.kind == "map":
            (user_key, value, *rest) = args
            ns = rest[0] if rest else namespace
            fallback = lambda: self._state.add(key, user_key, value, ns)  # noqa: E731
            self._one("map_add", key, ns, fallback, user_key=user_key, value=value)
            return
        (value, *rest) = args
        ns = rest[0] if rest else namespace
        self._one("add", key, ns, lambda: self._state.add(key, value, ns), value=value)

    def add_all(self, key: Any, *args: Any, namespace: str = "") -> None:
        if self._descriptor.kind == "map":
            (user_key, values, *rest) = args
            values, ns = list(values), rest[0] if rest else namespace
            rows = [{"key": key, "ns": ns, "user_key": user_key, "value": v} for v in values]
            fallback = lambda: self._state.add_all(key, user_key, values, ns)  # noqa: E731
        else:
            (values, *rest) = args
            values, ns = list(values), rest[0] if rest else namespace
            fallback = lambda: self._state.add_all(key, values, ns)  # noqa: E731
            if self._descriptor.kind == "list":  # addAll: one row with a list column
                if not values:
                    self._run("add", [{"key": key, "ns": ns, "value": []}], pa.list_(pa.int64()))
                else:
                    self._one("add", key, ns, fallback, value=values)
                return
            rows = [{"key": key, "ns": ns, "value": v} for v in values]
        if not rows:
            return
        try:
            self._run("map_add" if self._descriptor.kind == "map" else "add", rows)
        except _NotArrow:
            self._tx.fell_back(fallback)

    # -- map ----------------------------------------------------------------------------------

    def put(self, key: Any, user_key: str, value: Any, namespace: str = "") -> None:
        fallback = lambda: self._state.put(key, user_key, value, namespace)  # noqa: E731
        self._one("map_put", key, namespace, fallback, user_key=user_key, value=value)

    def put_all(self, key: Any, entries: dict[str, Any], namespace: str = "") -> None:
        rows = [{"key": key, "ns": namespace, "user_key": k, "value": v} for k, v in entries.items()]
        try:
            self._run("map_put", rows)
        except _NotArrow:
            self._tx.fell_back(lambda: self._state.put_all(key, entries, namespace))

    def remove(self, key: Any, user_key: str, namespace: str = "") -> None:
        self._one("map_remove", key, namespace, user_key=user_key)

    def contains(self, key: Any, user_key: str, namespace: str = "") -> bool:
        return self.get(key, user_key, namespace) is not None

    def get_all(self, key: Any, namespace: str = "") -> dict[str, Any] | None:
        return self._one("get", key, namespace, lambda: self._state.get_all(key, namespace))

    def entries(self, key: Any, namespace: str = "") -> list[tuple[str, Any]]:
        return list((self.get_all(key, namespace) or {}).items())

    def keys(self, key: Any, namespace: str = "") -> list[str]:
        return [k for k, _v in self.entries(key, namespace)]

    def values(self, key: Any, namespace: str = "") -> list[Any]:
        return [v for _k, v in self.entries(key, namespace)]

    def is_empty(self, key: Any, namespace: str = "") -> bool:
        return not self.entries(key, namespace)


class _NotArrow(Exception):
    """Values that no one Arrow column holds."""


class ColumnarTransaction:
    """A ``JobTransaction`` whose keyed states answer through the columnar core."""

    def __init__(self, tx: Any) -> None:
        self.tx = tx
        self.fallbacks = 0

    def fell_back(self, step: Any) -> Any:
        self.fallbacks += 1
        return step() if step is not None else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tx, name)

    def _typed(self, accessor: str, name: str) -> ColumnarState:
        return ColumnarState(self, getattr(self.tx, accessor)(name))

    def state(self, name: str) -> ColumnarState:
        return self._typed("state", name)

    def value(self, name: str) -> ColumnarState:
        return self._typed("value", name)

    def list(self, name: str) -> ColumnarState:
        return self._typed("list", name)

    def map(self, name: str) -> ColumnarState:
        return self._typed("map", name)

    def reducing(self, name: str) -> ColumnarState:
        return self._typed("reducing", name)

    def aggregating(self, name: str) -> ColumnarState:
        return self._typed("aggregating", name)


__all__ = ["ColumnarTransaction", "InvalidArgument", "InvalidValue"]
