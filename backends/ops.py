"""Keyed operations by name — the vocabulary of the batch API, usable on any state kind.

``apply_all(tx, ops)`` runs operations given as plain dicts (decoded straight from JSON or
msgpack, no model per operation) and returns their results: ``{"value": ...}`` for reads
(``None`` when absent) and ``{}`` for writes. The operations, what each carries and what it
means per state kind: the one table, ``protocol/ops.py``. A batch becomes runs (``runs.Run``:
one operation over the located rows of one state or time domain), which ``runs`` applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from statehouse.backends.errors import StateError
from statehouse.backends.job import JobTransaction
from statehouse.backends.keyed.base import each_row
from statehouse.backends.keyspace import Rows
from statehouse.backends.runs import Run, RunArgs, apply_run
from statehouse.backends.staging import STAGED_OP_OVERHEAD
from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.ops import OP_NAMES, OPS

# Where a batch's timer and raw-state operations run, in order among themselves (names no state
# can have), by the op table's target.
_TIMERS = "$timers"
_RAW = "$raw"
_GROUPS = {"timer": _TIMERS, "raw_keyed": _RAW, "raw_operator": _RAW}
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
        raise InvalidArgument(
            f"missing 'value': {op.get('op')!r} takes the value to write (add and map_add also take 'values', a list)"
        )
    return op["value"]


def _add_values(op: Mapping[str, Any]) -> list[Any]:
    if "values" in op:
        if "value" in op:
            raise InvalidArgument("give either 'value' or 'values', not both")
        return _field(op, "values", list, "a list of values")
    return [_value(op)]


def _user_key(op: Mapping[str, Any]) -> str:
    return _field(op, "user_key", str, "a string")


def _args(name: str, ops: list[Mapping[str, Any]]) -> RunArgs:
    """What a run of operations named ``name`` carries, row by row (as the op table says)."""
    spec = OPS[name]
    return RunArgs(
        user_keys=each_row(ops, _user_key) if "user_key" in spec.fields else None,
        values=each_row(ops, _value) if "value" in spec.fields and not spec.takes_values else None,
        add_lists=each_row(ops, _add_values) if spec.takes_values else None,
    )


def _checked(op: Any) -> tuple[str, str, str]:
    """An operation's name, state and namespace, its shape checked."""
    if type(op) is not dict and not isinstance(op, Mapping):  # decoded bodies are dicts: skip the ABC check
        raise InvalidArgument(f"an operation must be an object; got {type(op).__name__}")
    name = op.get("op")
    if not isinstance(name, str) or name not in OPS:
        raise InvalidArgument(f"'op' must be one of {', '.join(OP_NAMES)}; got {name!r}")
    group = _GROUPS.get(OPS[name].target)
    if group is not None:
        return name, group, ""
    state = _field(op, "state", str, "a state name")
    if "key" not in op:
        raise InvalidArgument(f"missing 'key': {name!r} on state {state!r} needs the key it reads or writes")
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
            _apply_state_ops(tx, operations, checked, indexes, results)
    except StateError:
        if len(by_state) == 1:
            raise
        tx.rollback()
        for index in range(len(operations)):  # raises for the first failing operation
            _apply_state_ops(tx, operations, checked, [index], results)
        raise
    return results


def _apply_state_ops(
    tx: JobTransaction,
    operations: list[Any],
    checked: list[tuple[str, str, str]],
    indexes: list[int],
    results: list[dict[str, Any]],
) -> None:
    """Apply ``operations[i] for i in indexes`` (one state's, or the timers', in order), each
    run of consecutive operations of one name (of one time domain, for timers) as one run."""
    group = checked[indexes[0]][1]
    start = 0
    while start < len(indexes):
        end = start + 1
        ran = indexes[start:end]
        try:
            if group == _TIMERS:
                run, end = _timer_run(tx, operations, indexes, start)
                ran = indexes[start:end]
            elif group == _RAW:
                run = _raw_run(tx, operations[indexes[start]])
            else:
                name, state_name, _ns = checked[indexes[start]]
                while end < len(indexes) and checked[indexes[end]][0] == name:
                    end += 1
                ran = indexes[start:end]
                state = tx.state(state_name)
                rows = state.locate_many([operations[i]["key"] for i in ran], [checked[i][2] for i in ran])
                run = Run(state_name, name, rows, _args(name, [operations[i] for i in ran]))
            values = apply_run(tx, run)
        except StateError as exc:
            index = ran[exc.unplaced("row") or 0]  # no row: the run's first op (the whole run is refused)
            raise exc.within(f"op {index}", op_index=index) from None
        if values is not None:
            for i, value in zip(ran, values, strict=True):
                results[i] = {"value": value}
        start = end


def _timer_run(tx: JobTransaction, operations: list[Any], indexes: list[int], start: int) -> tuple[Run, int]:
    """The run of timer operations from ``indexes[start]``: the consecutive ones of its name and
    time domain, each checked and located, and where it ends. An operation that fails its
    checks ends the run before it, or, first, raises (its error names it as row 0)."""
    located: list[tuple[int, bytes]] = []
    name = domain = ""
    end = start
    while end < len(indexes):
        op = operations[indexes[end]]
        try:
            op_domain, key_group, primary = tx.timers.locate_op(op)
        except StateError:
            if end > start:
                break  # its own run raises
            raise
        if end > start and (op["op"], op_domain) != (name, domain):
            break
        name, domain = op["op"], op_domain
        located.append((key_group, primary))
        end += 1
    rows = Rows([kg for kg, _p in located], [p for _kg, p in located])
    return Run(domain, name, rows), end


def _raw_run(tx: JobTransaction, op: Mapping[str, Any]) -> Run:
    """A raw-state operation's run (one row): its fields checked, its record located."""
    name = op["op"]
    spec = OPS[name]
    if spec.target == "raw_keyed":
        rows = tx.raw_keyed.locate(_field(op, "key_group", int, "an integer key group"))
        if "value" not in spec.fields:
            return Run("", name, rows)
        return Run("", name, rows, RunArgs(values=[_field(op, "value", bytes, _BYTES)]))
    operator = _field(op, "operator", str, "an operator name")
    subtask = _field(op, "subtask", int, "an integer subtask index")
    rows = tx.raw_operator.locate(operator, subtask)
    values = [_field(op, "value", list, f"a list of partitions, each {_BYTES}")] if "value" in spec.fields else None
    return Run(operator, name, rows, RunArgs(values=values, subtasks=[subtask]))


_BYTES = "bytes (msgpack bin; base64 strings in a JSON body)"


class BatchOps:
    """A batch's operations (decoded dicts, checked when applied): what a batch request, or a
    one-key route, asks (``attempts.Work``)."""

    STAGED_OVERHEAD: ClassVar[int] = STAGED_OP_OVERHEAD
    held_bytes = 0  # the runs' memory is in the overhead per write

    def __init__(self, ops: list[Any]) -> None:
        self.ops = ops

    def apply(self, tx: JobTransaction) -> list[dict[str, Any]]:
        return apply_all(tx, self.ops)


def apply(tx: JobTransaction, op: Mapping[str, Any]) -> dict[str, Any]:
    """Run one operation inside ``tx``; raises a ``StateError`` that says what to fix."""
    try:
        return apply_all(tx, [op])[0]
    except StateError as exc:
        exc.unplaced("op", "op_index")
        raise
