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

from statehouse.backends.errors import InvalidArgument, WrongStateKind
from statehouse.backends.job import JobTransaction
from statehouse.backends.keyed import KeyedState, ListState, MapState, ReducingState, ValueState

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


def _get(state: KeyedState, key: Any, ns: str, op: Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(state, MapState):
        return {"value": state.get_all(key, ns)}
    return {"value": state.get(key, ns)}  # type: ignore[attr-defined]


def _put(state: KeyedState, key: Any, ns: str, op: Mapping[str, Any]) -> dict[str, Any]:
    value = _value(op)
    if isinstance(state, ValueState):
        state.update(key, value, ns)
    elif isinstance(state, ListState):
        if not isinstance(value, list):
            raise InvalidArgument("'put' on a list state replaces the list: 'value' must be a list")
        state.update(key, value, ns)
    elif isinstance(state, MapState):
        if not isinstance(value, dict):
            raise InvalidArgument("'put' on a map state replaces the map: 'value' must be an object")
        state.update(key, value, ns)
    else:
        raise _wrong(state, "put")
    return _EMPTY


def _add(state: KeyedState, key: Any, ns: str, op: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(state, ListState | ReducingState):
        raise _wrong(state, "add")
    state.add_all(key, _add_values(op), ns)
    return _EMPTY


def _clear(state: KeyedState, key: Any, ns: str, op: Mapping[str, Any]) -> dict[str, Any]:
    state.clear(key, ns)
    return _EMPTY


def _map_op(fn: Callable[[MapState, Any, str, str, Mapping[str, Any]], dict[str, Any]], name: str):
    def run(state: KeyedState, key: Any, ns: str, op: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(state, MapState):
            raise _wrong(state, name)
        return fn(state, key, ns, _field(op, "user_key", str, "a string"), op)

    return run


def _map_put(state: MapState, key: Any, ns: str, user_key: str, op: Mapping[str, Any]) -> dict[str, Any]:
    state.put(key, user_key, _value(op), ns)
    return _EMPTY


def _map_add(state: MapState, key: Any, ns: str, user_key: str, op: Mapping[str, Any]) -> dict[str, Any]:
    state.add_all(key, user_key, _add_values(op), ns)
    return _EMPTY


def _map_remove(state: MapState, key: Any, ns: str, user_key: str, op: Mapping[str, Any]) -> dict[str, Any]:
    state.remove(key, user_key, ns)
    return _EMPTY


_HANDLERS: dict[str, Callable[[KeyedState, Any, str, Mapping[str, Any]], dict[str, Any]]] = {
    "get": _get,
    "put": _put,
    "add": _add,
    "clear": _clear,
    "map_get": _map_op(lambda s, k, ns, uk, op: {"value": s.get(k, uk, ns)}, "map_get"),
    "map_put": _map_op(_map_put, "map_put"),
    "map_add": _map_op(_map_add, "map_add"),
    "map_remove": _map_op(_map_remove, "map_remove"),
    "map_contains": _map_op(lambda s, k, ns, uk, op: {"value": s.contains(k, uk, ns)}, "map_contains"),
}


def apply(tx: JobTransaction, op: Mapping[str, Any]) -> dict[str, Any]:
    """Run one operation inside ``tx``; raises a ``StateError`` that says what to fix."""
    if type(op) is not dict and not isinstance(op, Mapping):  # decoded bodies are dicts: skip the ABC check
        raise InvalidArgument(f"an operation must be an object; got {type(op).__name__}")
    name = op.get("op")
    handler = _HANDLERS.get(name) if isinstance(name, str) else None
    if handler is None:
        raise InvalidArgument(f"'op' must be one of {', '.join(OPS)}; got {name!r}")
    state = tx.state(_field(op, "state", str, "a state name"))
    if "key" not in op:
        raise InvalidArgument("missing 'key'")
    ns = op.get("ns", "")
    if not isinstance(ns, str):
        raise InvalidArgument(f"'ns' must be a string; got {type(ns).__name__}")
    return handler(state, op["key"], ns, op)
