"""Keyed operations by name — the vocabulary of the batch API, usable on any state kind.

``apply(tx, op)`` runs one operation given as a plain dict (decoded straight from JSON or
msgpack, no model per operation) and returns its result: ``{"value": ...}`` for reads
(``None`` when absent) and ``{}`` for writes. What each generic operation means per kind:

=============  ==========================================================================
``get``        value / list / whole map / reduced / aggregated result
``put``        value: update; list: replace (``value`` is a list); map: replace all (object)
``add``        list: add (``value``) or addAll (``values``); reducing/aggregating: add
``clear``      any kind
``map_get``    ``map_put``, ``map_remove``, ``map_contains``: one map entry (``user_key``)
``map_add``    fold ``value`` (or each of ``values``) into one map entry with the map's
               ``function``; a map registered without one refuses it
=============  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

from statehouse.backends.errors import InvalidArgument, StateError, WrongStateKind
from statehouse.backends.job import JobTransaction
from statehouse.backends.keyed import KeyedState, ListState, MapState, ReducingState, Rows, ValueState
from statehouse.backends.keyed.base import each_row

OpName = Literal["get", "put", "add", "clear", "map_get", "map_put", "map_add", "map_remove", "map_contains"]
OPS: tuple[str, ...] = get_args(OpName)
_EMPTY: dict[str, Any] = {}


def _field(op: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    try:
        value = op[name]
    except KeyError:
        raise InvalidArgument(f"missing '{name}' ({what})") from None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidArgument(f"'{name}' must be {what}; got {type(value).__name__}")
    return value


def _value(op: Mapping[str, Any]) -> Any:
    if "value" not in op:
        raise InvalidArgument("missing 'value'")
    return op["value"]


def _add_values(op: Mapping[str, Any]) -> list[Any]:
    if "values" in op:
        if "value" in op:
            raise InvalidArgument("give either 'value' or 'values', not both")
        return _field(op, "values", list, "a list of values")
    return [_value(op)]


def _wrong(state: KeyedState, op: str) -> WrongStateKind:
    hint = " (use 'map_add' to fold a value into one map entry)" if op == "add" and isinstance(state, MapState) else ""
    return WrongStateKind(f"'{op}' does not apply to {state.descriptor.kind} state {state.descriptor.name!r}{hint}")


def _values_of(ops: list[Mapping[str, Any]]) -> list[Any]:
    return [_value(op) for op in ops]


def _get(state: KeyedState, rows: Rows, ops: list[Mapping[str, Any]]) -> list[Any]:
    return state.get_many(rows)  # type: ignore[attr-defined]  # every kind reads


def _put(state: KeyedState, rows: Rows, ops: list[Mapping[str, Any]]) -> None:
    values = _values_of(ops)
    if isinstance(state, ValueState):
        state.update_many(rows, values)
    elif isinstance(state, ListState):
        if not all(isinstance(v, list) for v in values):
            raise _first(
                values,
                lambda v: not isinstance(v, list),
                InvalidArgument("'put' on a list state replaces the list: 'value' must be a list"),
            )
        state.update_many(rows, values)
    elif isinstance(state, MapState):
        if not all(isinstance(v, dict) for v in values):
            raise _first(
                values,
                lambda v: not isinstance(v, dict),
                InvalidArgument("'put' on a map state replaces the map: 'value' must be an object"),
            )
        state.update_many(rows, values)
    else:
        raise _wrong(state, "put")


def _first(values: list[Any], bad: Callable[[Any], bool], error: StateError) -> StateError:
    row = next(i for i, v in enumerate(values) if bad(v))
    return error.within(f"row {row}", row=row)


def _expanded(rows: Rows, ops: list[Mapping[str, Any]]) -> tuple[Rows, list[Any], list[int]]:
    """One row per value added (an op with ``values`` adds several, in order), and each new
    row's operation."""
    per_op = each_row(ops, _add_values)
    origin = [i for i, values in enumerate(per_op) for _ in values]
    return (
        Rows([rows.key_groups[i] for i in origin], [rows.primaries[i] for i in origin]),
        [v for values in per_op for v in values],
        origin,
    )


def _add(state: KeyedState, rows: Rows, ops: list[Mapping[str, Any]]) -> None:
    if isinstance(state, ListState):
        state.add_many(rows, each_row(ops, _add_values))
    elif isinstance(state, ReducingState):
        many, values, origin = _expanded(rows, ops)
        _in_ops(origin, lambda: state.add_many(many, values))
    else:
        raise _wrong(state, "add")


def _in_ops(origin: list[int], run: Callable[[], Any]) -> Any:
    """Run over expanded rows; an error names the operation the failing row came from."""
    try:
        return run()
    except StateError as exc:
        if "row" in exc.extra:
            row = exc.extra["row"]
            exc.detail = exc.detail.removeprefix(f"row {row}: ")
            raise exc.within(f"row {origin[row]}", row=origin[row]) from None
        raise


def _clear(state: KeyedState, rows: Rows, ops: list[Mapping[str, Any]]) -> None:
    state.clear_many(rows)


def _user_keys(ops: list[Mapping[str, Any]]) -> list[str]:
    return each_row(ops, lambda op: _field(op, "user_key", str, "a string"))


def _map(state: KeyedState, name: str) -> MapState:
    if not isinstance(state, MapState):
        raise _wrong(state, name)
    return state


def _map_add(state: KeyedState, rows: Rows, ops: list[Mapping[str, Any]]) -> None:
    user_keys = _user_keys(ops)
    many, values, origin = _expanded(rows, ops)
    map_state = _map(state, "map_add")
    _in_ops(origin, lambda: map_state.add_entries_many(many, [user_keys[i] for i in origin], values))


def _map_contains(state: KeyedState, rows: Rows, ops: list[Mapping[str, Any]]) -> list[Any]:
    found = _map(state, "map_contains").get_entries_many(rows, _user_keys(ops))
    return [value is not None for value in found]


Run = Callable[[KeyedState, Rows, list[Mapping[str, Any]]], list[Any] | None]
_RUNS: dict[str, Run] = {
    "get": _get,
    "put": _put,
    "add": _add,
    "clear": _clear,
    "map_get": lambda s, r, o: _map(s, "map_get").get_entries_many(r, _user_keys(o)),
    "map_put": lambda s, r, o: _map(s, "map_put").put_entries_many(r, _user_keys(o), _values_of(o)),
    "map_add": _map_add,
    "map_remove": lambda s, r, o: _map(s, "map_remove").remove_many(r, _user_keys(o)),
    "map_contains": _map_contains,
}


def _checked(op: Any) -> tuple[str, str, str]:
    """An operation's name, state and namespace, its shape checked."""
    if type(op) is not dict and not isinstance(op, Mapping):  # decoded bodies are dicts: skip the ABC check
        raise InvalidArgument(f"an operation must be an object; got {type(op).__name__}")
    name = op.get("op")
    if not isinstance(name, str) or name not in _RUNS:
        raise InvalidArgument(f"'op' must be one of {', '.join(OPS)}; got {name!r}")
    state = _field(op, "state", str, "a state name")
    if "key" not in op:
        raise InvalidArgument("missing 'key'")
    ns = op.get("ns", "")
    if not isinstance(ns, str):
        raise InvalidArgument(f"'ns' must be a string; got {type(ns).__name__}")
    return name, state, ns


def apply_all(tx: JobTransaction, operations: list[Any]) -> list[dict[str, Any]]:
    """Run a batch inside ``tx``, in order; raises a ``StateError`` naming the failing op's index.

    Operations on different states never see each other, so each state's operations run as
    one sequence, and consecutive operations of one name in it run together through the
    state's ``*_many`` methods (the columnar path's): the same rules as one by one — a key
    that comes back sees its earlier operations — with one read and one write of the
    transaction per run. When an operation fails, the batch runs again one operation at a
    time, so the problem names the first failing operation, as in order it would be."""
    checked = []
    for index, op in enumerate(operations):
        try:
            checked.append(_checked(op))
        except StateError as exc:
            raise exc.within(f"op {index}", op_index=index) from None
    by_state: dict[str, list[int]] = {}
    for index, (_name, state, _ns) in enumerate(checked):
        by_state.setdefault(state, []).append(index)
    results: list[dict[str, Any]] = [_EMPTY] * len(operations)
    try:
        for indexes in by_state.values():
            _apply_runs(tx, operations, checked, indexes, results)
    except StateError:
        if len(by_state) == 1:
            raise
        tx.rollback()
        for index in range(len(operations)):  # raises for the first failing operation
            _apply_runs(tx, operations, checked, [index], results)
        raise
    return results


def _apply_runs(
    tx: JobTransaction,
    operations: list[Any],
    checked: list[tuple[str, str, str]],
    indexes: list[int],
    results: list[dict[str, Any]],
) -> None:
    """Apply ``operations[i] for i in indexes`` (one state's, in order), run by run."""
    start = 0
    while start < len(indexes):
        name, state_name, _ns = checked[indexes[start]]
        end = start + 1
        while end < len(indexes) and checked[indexes[end]][0] == name:
            end += 1
        run = indexes[start:end]
        try:
            state = tx.state(state_name)
            rows = state.locate_many([operations[i]["key"] for i in run], [checked[i][2] for i in run])
            values = _RUNS[name](state, rows, [operations[i] for i in run])
        except StateError as exc:
            index = run[exc.extra.pop("row", 0)]
            exc.detail = exc.detail.removeprefix(f"row {run.index(index)}: ")
            raise exc.within(f"op {index}", op_index=index) from None
        if values is not None:
            for i, value in zip(run, values, strict=True):
                results[i] = {"value": value}
        start = end


def apply(tx: JobTransaction, op: Mapping[str, Any]) -> dict[str, Any]:
    """Run one operation inside ``tx``; raises a ``StateError`` that says what to fix."""
    try:
        return apply_all(tx, [op])[0]
    except StateError as exc:
        exc.detail = exc.detail.removeprefix("op 0: ")
        exc.extra.pop("op_index", None)
        raise
