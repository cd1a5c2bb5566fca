"""The keyed-state API of a transaction (``tx.value("v").get("k")``, ...) through each of the
engine's doors, so that the conformance suite runs every case through all of them:

- ``one_key``: the transaction's own state objects, what the one-key routes call;
- ``batch``: every call becomes operations for ``ops.apply_all``, the batch route's entry;
- ``columnar``: every call becomes one Arrow table for ``columns.apply_columns``.

Several-key calls (``put_all``, ``add_all``) become several operations or rows of one request.
The kinds are checked by the transaction's typed accessors (``tx.map(name)`` on a reducing
state raises), as the client's typed API checks them.

No door falls back silently. Values that no one Arrow column holds (ints beside strings, a key
beyond int64) cannot travel the columnar door: it *refuses* the step (the Arrow conversion
fails, or the engine answers ``untyped_values``), the refusal is recorded with its operation
and message, and the step is then done through the batch door so that the case goes on. The
conformance suite declares every such step per case and fails on any it did not declare.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from statehouse.backends.columns import ColumnOp, apply_columns
from statehouse.backends.ops import apply_all
from statehouse.snapshots.stored.arrow import UntypedValues

DOORS = ("one_key", "batch", "columnar")
_KEY_TYPES = {"string": pa.string(), "int": pa.int32(), "long": pa.int64()}
_READS = ("get", "map_get", "map_contains", "add_get")  # the operations that answer a value per row
Row = dict[str, Any]  # key, ns, and user_key, value or values as the operation takes them


class Refused(Exception):
    """A step the columnar door cannot carry; the message says why."""


def _column(values: list[Any], what: str, kind: pa.DataType | None = None) -> pa.Array:
    try:
        return pa.array(values, kind)
    except (pa.ArrowException, TypeError, OverflowError) as exc:
        raise Refused(f"the {what}s {values!r} have no one Arrow type: {exc}") from None


def _batch(tx: Any, state: str, op: str, rows: list[Row]) -> list[Any]:
    results = apply_all(tx, [{"op": op, "state": state, **row} for row in rows])
    return [r["value"] for r in results] if op in _READS else []


def _columnar(tx: Any, state: str, op: str, rows: list[Row]) -> list[Any]:
    if op == "map_contains":  # no such columnar operation: an entry is there when map_get finds it
        return [v is not None for v in _columnar(tx, state, "map_get", rows)]
    descriptor = tx.state(state).descriptor
    if any("values" in r for r in rows):
        if descriptor.kind == "list":  # addAll: one row whose value is a list
            rows = [{**{k: v for k, v in r.items() if k != "values"}, "value": r["values"]} for r in rows]
        else:  # one row per value, in order
            rows = [{**{k: v for k, v in r.items() if k != "values"}, "value": v} for r in rows for v in r["values"]]
        if not rows:
            return []
    keys = [r["key"] for r in rows]
    try:
        key_column = pa.array(keys, _KEY_TYPES[descriptor.key_type])
    except (pa.ArrowException, TypeError, OverflowError):
        key_column = _column(keys, "key")  # a key of another type: the engine must refuse the column
    columns = {"key": key_column, "ns": pa.array([r["ns"] for r in rows], pa.string())}
    if "user_key" in rows[0]:
        columns["user_key"] = pa.array([r["user_key"] for r in rows], pa.string())
    if "value" in rows[0]:
        columns["value"] = _values([r["value"] for r in rows], descriptor.kind, op)
    try:
        result = apply_columns(tx, ColumnOp.parse(state, op, pa.table(columns)))
    except UntypedValues as exc:
        raise Refused(f"{exc.code}: {exc}") from None
    if result is None:
        return []
    return [dict(v) if pa.types.is_map(result.type) and v is not None else v for v in result.to_pylist()]


def _values(values: list[Any], kind: str, op: str) -> pa.Array:
    if kind == "map" and op == "put":  # whole maps: a map column typed by all their entries
        entries = _column([v for m in values for v in m.values()], "map value")
        entry_type = entries.type if len(entries) else pa.int64()
        return pa.array([list(m.items()) for m in values], pa.map_(pa.string(), entry_type))
    if kind == "list" and all(isinstance(v, list) and not v for v in values):
        return pa.array(values, pa.list_(pa.int64()))  # empty lists: any element type
    return _column(values, "value")


class DoorState:
    """One keyed state's calls, as operations through a door."""

    def __init__(self, tx: DoorTransaction, state: Any) -> None:
        self._tx = tx
        self._name = state.descriptor.name
        self._kind = state.descriptor.kind

    def _run(self, op: str, rows: list[Row]) -> list[Any]:
        return self._tx.run(self._name, op, rows) if rows else []

    def _one(self, op: str, key: Any, ns: str, **fields: Any) -> Any:
        answer = self._run(op, [{"key": key, "ns": ns, **fields}])
        return answer[0] if answer else None

    # -- every kind ---------------------------------------------------------------------------

    def get(self, key: Any, *args: Any, namespace: str = "") -> Any:
        if self._kind == "map":
            (user_key, *rest) = args
            return self._one("map_get", key, rest[0] if rest else namespace, user_key=user_key)
        return self._one("get", key, args[0] if args else namespace)

    def clear(self, key: Any, namespace: str = "") -> None:
        self._one("clear", key, namespace)

    def update(self, key: Any, value: Any, namespace: str = "") -> None:
        self._one("put", key, namespace, value=value)

    # -- list, reducing, aggregating, and map_add ---------------------------------------------

    def add(self, key: Any, *args: Any, namespace: str = "") -> None:
        if self._kind == "map":
            (user_key, value, *rest) = args
            self._one("map_add", key, rest[0] if rest else namespace, user_key=user_key, value=value)
        else:
            (value, *rest) = args
            self._one("add", key, rest[0] if rest else namespace, value=value)

    def add_all(self, key: Any, *args: Any, namespace: str = "") -> None:
        if self._kind == "map":
            (user_key, values, *rest) = args
            self._one("map_add", key, rest[0] if rest else namespace, user_key=user_key, values=list(values))
        else:
            (values, *rest) = args
            self._one("add", key, rest[0] if rest else namespace, values=list(values))

    def add_get(self, key: Any, value: Any, namespace: str = "") -> Any:
        return self._one("add_get", key, namespace, value=value)

    def add_get_all(self, key: Any, values: list[Any], namespace: str = "") -> Any:
        """One request adding ``values`` in order: the result after the last (a columnar door's
        rows, one per value, each answer the running result; the last row's is the one)."""
        return self._run("add_get", [{"key": key, "ns": namespace, "values": list(values)}])[-1]

    # -- map ----------------------------------------------------------------------------------

    def put(self, key: Any, user_key: str, value: Any, namespace: str = "") -> None:
        self._one("map_put", key, namespace, user_key=user_key, value=value)

    def put_all(self, key: Any, entries: dict[str, Any], namespace: str = "") -> None:
        self._run("map_put", [{"key": key, "ns": namespace, "user_key": k, "value": v} for k, v in entries.items()])

    def remove(self, key: Any, user_key: str, namespace: str = "") -> None:
        self._one("map_remove", key, namespace, user_key=user_key)

    def contains(self, key: Any, user_key: str, namespace: str = "") -> bool:
        return bool(self._one("map_contains", key, namespace, user_key=user_key))

    def get_all(self, key: Any, namespace: str = "") -> dict[str, Any] | None:
        return self._one("get", key, namespace)

    def entries(self, key: Any, namespace: str = "") -> list[tuple[str, Any]]:
        return list((self.get_all(key, namespace) or {}).items())

    def keys(self, key: Any, namespace: str = "") -> list[str]:
        return [k for k, _v in self.entries(key, namespace)]

    def values(self, key: Any, namespace: str = "") -> list[Any]:
        return [v for _k, v in self.entries(key, namespace)]

    def is_empty(self, key: Any, namespace: str = "") -> bool:
        return not self.entries(key, namespace)


class DoorTransaction:
    """A ``JobTransaction`` whose keyed states answer through the ``batch`` or ``columnar`` door.

    ``refusals`` collects ``(operation, message)`` for each step the columnar door refused."""

    def __init__(self, tx: Any, door: str, refusals: list[tuple[str, str]] | None = None) -> None:
        if door not in ("batch", "columnar"):
            raise ValueError(f"door must be batch or columnar (one_key is the transaction itself); got {door!r}")
        self.tx = tx
        self.door = door
        self.refusals = [] if refusals is None else refusals

    def run(self, state: str, op: str, rows: list[Row]) -> list[Any]:
        if self.door == "batch":
            return _batch(self.tx, state, op, rows)
        try:
            return _columnar(self.tx, state, op, rows)
        except Refused as refused:
            self.refusals.append((op, str(refused)))
            return _batch(self.tx, state, op, rows)

    def __getattr__(self, name: str) -> Any:  # operator state, frozen views: the transaction's own
        return getattr(self.tx, name)

    def _typed(self, accessor: str, name: str) -> DoorState:
        return DoorState(self, getattr(self.tx, accessor)(name))

    def state(self, name: str) -> DoorState:
        return self._typed("state", name)

    def value(self, name: str) -> DoorState:
        return self._typed("value", name)

    def list(self, name: str) -> DoorState:
        return self._typed("list", name)

    def map(self, name: str) -> DoorState:
        return self._typed("map", name)

    def reducing(self, name: str) -> DoorState:
        return self._typed("reducing", name)

    def aggregating(self, name: str) -> DoorState:
        return self._typed("aggregating", name)


def through(tx: Any, door: str, refusals: list[tuple[str, str]] | None = None) -> Any:
    """``tx`` as the given door serves it."""
    return tx if door == "one_key" else DoorTransaction(tx, door, refusals)


__all__ = ["DOORS", "DoorTransaction", "Refused", "through"]
