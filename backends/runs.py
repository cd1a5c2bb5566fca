"""A run: one named operation over many located rows of one state, or of one time domain's
timers, or of raw state. It is the one request shape of the engine: every door (the one-key
routes, the batch's operations, raw state's among them, the columnar endpoint's table of rows,
the timer endpoints and their columns, an advance's firing) parses its wire format into runs,
:func:`apply_run` applies any run, and a task attempt's staged log is the runs it wrote, which
the epoch commit applies again (``backends/attempts.py``). It maps the generic operation
(``protocol/ops.py``: the table of names, their fields and the state kinds that take them) to
the state kind's ``*_many`` method, or to the timers' or raw state's writes; they hold the rules.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from statehouse.backends.columnar_codec import Packed
from statehouse.backends.errors import StateError, WrongStateKind
from statehouse.backends.keyed import KeyedState, ListState, MapState, ReducingState, Rows, ValueState
from statehouse.backends.keyed.reducing_state import NOTHING_TO_ADD_GET
from statehouse.backends.raw_state import RawKeyedState, RawOperatorState
from statehouse.backends.timers import TimerService, check_domain
from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.ops import OPS

# An advance's firing as its staged run records it: the domain's time raised to ``RunArgs.time``
# and exactly these timers deleted (not a new advance: at commit time other winners' timers may
# be due too, and nobody has handled them). Not an operation of the API.
FIRE = "fire"


@dataclass(frozen=True, slots=True)
class RunArgs:
    """What the rows carry besides their keys, one item per row, as the operation needs."""

    user_keys: list[str] | None = None  # map entry operations
    values: list[Any] | None = None  # put, map_put
    # add, map_add: either the values each row adds, in order (a batch's ``values``, a columnar
    # addAll), or one value per row (a column)
    add_lists: list[list[Any]] | None = None
    add_values: list[Any] | None = None
    packed: Packed | None = None  # a value state's put, its values already packed (a columnar door's)
    time: int | None = None  # a firing: the domain's time after it
    subtasks: list[int] | None = None  # raw operator operations: each row's subtask

    def per_row(self) -> list[list[Any]]:
        """The values each row adds, whichever way they were given."""
        if self.add_lists is not None:
            return self.add_lists
        return [[v] for v in self.add_values or []]


_NO_ARGS = RunArgs()


@dataclass(frozen=True, slots=True)
class Run:
    """Operation ``op`` over ``rows`` (located: key groups and stored keys) of state ``state``;
    for a timer operation (``register_timer``, ``delete_timer``, :data:`FIRE`) ``state`` is the
    time domain, for a raw operator operation the operator, for a raw keyed one ``""``
    (``protocol/ops.py``: an operation's target). ``args``: what the rows carry besides keys."""

    state: str
    op: str
    rows: Rows
    args: RunArgs = _NO_ARGS

    @property
    def writes(self) -> bool:
        return self.op == FIRE or OPS[self.op].writes

    @property
    def ops(self) -> int:
        """The write operations it counts as (what a task counts, and the driver's winners name):
        one per row; a firing is one advance, whatever it fired."""
        return 1 if self.op == FIRE else len(self.rows)


class RunTarget(Protocol):
    """What a run applies to (a ``JobTransaction``: this module is below the job), and what
    keeps the runs applied that write (a task attempt's log is those of its requests)."""

    written: list[Run]

    def state(self, name: str) -> KeyedState: ...

    @property
    def timers(self) -> TimerService: ...

    @property
    def raw_keyed(self) -> RawKeyedState: ...

    @property
    def raw_operator(self) -> RawOperatorState: ...


def apply_run(tx: RunTarget, run: Run) -> list[Any] | None:
    """Apply ``run`` inside ``tx``, its rows in order; a read returns one value per row. An
    error names its row (``row N:``, and ``row`` in its extra)."""
    other = _OTHER_RUNS.get(run.op)
    if other is not None:
        result = other(tx, run)
    else:
        state = tx.state(run.state)
        if state.descriptor.kind not in OPS[run.op].kinds:
            raise wrong_kind(state, run.op)
        result = _RUNS[run.op](state, state.accessed(run.rows), run.args)
    if run.writes:
        tx.written.append(run)
    return result


def wrong_kind(state: KeyedState, op: str) -> WrongStateKind:
    hint = " (use 'map_add' to fold a value into one map entry)" if op == "add" and isinstance(state, MapState) else ""
    return WrongStateKind(f"'{op}' does not apply to {state.descriptor.kind} state {state.descriptor.name!r}{hint}")


def _get(state: KeyedState, rows: Rows, args: RunArgs) -> list[Any]:
    return state.get_many(rows)  # type: ignore[attr-defined]  # every kind reads


def _put(state: KeyedState, rows: Rows, args: RunArgs) -> None:
    values = args.values or []
    if isinstance(state, ValueState):
        if args.packed is not None:
            state.update_payloads(rows, *args.packed)
        else:
            state.update_many(rows, values)
    elif isinstance(state, ListState):
        _each_is(values, list, "'put' on a list state replaces the list: 'value' must be a list")
        state.update_many(rows, values)
    elif isinstance(state, MapState):
        _each_is(values, dict, "'put' on a map state replaces the map: 'value' must be an object (a map)")
        state.update_many(rows, values)
    else:
        raise wrong_kind(state, "put")


def _each_is(values: list[Any], kind: type, detail: str) -> None:
    for row, value in enumerate(values):
        if not isinstance(value, kind):
            raise InvalidArgument(detail).within(f"row {row}", row=row)


def _add(state: KeyedState, rows: Rows, args: RunArgs) -> None:
    if isinstance(state, ListState):
        state.add_many(rows, args.per_row())
    elif isinstance(state, ReducingState):
        if args.add_values is not None:
            state.add_many(rows, args.add_values)
            return
        many, values, origin = _one_row_per_value(rows, args.per_row())
        _named_by_origin(origin, lambda: state.add_many(many, values))
    else:
        raise wrong_kind(state, "add")


def _add_get(state: KeyedState, rows: Rows, args: RunArgs) -> list[Any]:
    """``add``, answering each row's result after it: a row adding several values (a batch's
    ``values``) answers the result after its last one."""
    if not isinstance(state, ReducingState):
        raise wrong_kind(state, "add_get")
    if args.add_values is not None:
        return state.add_get_many(rows, args.add_values)
    adds = args.per_row()
    for row, values in enumerate(adds):
        if not values:
            raise InvalidArgument(NOTHING_TO_ADD_GET).within(f"row {row}", row=row)
    many, values, origin = _one_row_per_value(rows, adds)
    answers = _named_by_origin(origin, lambda: state.add_get_many(many, values))
    return [answers[end - 1] for end in itertools.accumulate(map(len, adds))]


def _one_row_per_value(rows: Rows, adds: list[list[Any]]) -> tuple[Rows, list[Any], list[int]]:
    """One row per value added (a row may add several, in order), and each new row's origin."""
    origin = [row for row, values in enumerate(adds) for _ in values]
    many = Rows([rows.key_groups[i] for i in origin], [rows.primaries[i] for i in origin])
    return many, [v for values in adds for v in values], origin


def _named_by_origin(origin: list[int], run: Callable[[], Any]) -> Any:
    """Run over rows made by ``_one_row_per_value``; an error names the row it came from."""
    try:
        return run()
    except StateError as exc:
        row = exc.unplaced("row")
        if row is None:
            raise
        raise exc.within(f"row {origin[row]}", row=origin[row]) from None


def _clear(state: KeyedState, rows: Rows, args: RunArgs) -> None:
    state.clear_many(rows)


def _map(state: KeyedState, name: str) -> MapState:
    if not isinstance(state, MapState):
        raise wrong_kind(state, name)
    return state


def _map_add(state: KeyedState, rows: Rows, args: RunArgs) -> None:
    map_state, user_keys = _map(state, "map_add"), args.user_keys or []
    if args.add_values is not None:
        map_state.add_entries_many(rows, user_keys, args.add_values)
        return
    many, values, origin = _one_row_per_value(rows, args.per_row())
    _named_by_origin(origin, lambda: map_state.add_entries_many(many, [user_keys[i] for i in origin], values))


def _map_contains(state: KeyedState, rows: Rows, args: RunArgs) -> list[Any]:
    found = _map(state, "map_contains").get_entries_many(rows, args.user_keys or [], answers=False)
    return [value is not None for value in found]


_RUNS: dict[str, Callable[[KeyedState, Rows, RunArgs], list[Any] | None]] = {
    "get": _get,
    "put": _put,
    "add": _add,
    "add_get": _add_get,
    "clear": _clear,
    "map_get": lambda s, r, a: _map(s, "map_get").get_entries_many(r, a.user_keys or []),
    "map_put": lambda s, r, a: _map(s, "map_put").put_entries_many(r, a.user_keys or [], a.values or []),
    "map_add": _map_add,
    "map_remove": lambda s, r, a: _map(s, "map_remove").remove_many(r, a.user_keys or []),
    "map_contains": _map_contains,
}


def _fire(tx: RunTarget, run: Run) -> None:
    assert run.args.time is not None  # a firing's run always carries its time
    tx.timers.apply_fired(check_domain(run.state), run.args.time, run.rows)


def _timers(delete: bool) -> Callable[[RunTarget, Run], None]:
    return lambda tx, r: tx.timers.write_many(check_domain(r.state), r.rows.key_groups, r.rows.primaries, delete=delete)


def _raw_keyed(write: Callable[[RawKeyedState, int, bytes], Any]) -> Callable[[RunTarget, Run], None]:
    """A write of every row's key group stream (``value``: the row's bytes)."""

    def apply(tx: RunTarget, run: Run) -> None:
        for key_group, value in zip(run.rows.key_groups, run.args.values or [b""] * len(run.rows), strict=True):
            write(tx.raw_keyed, key_group, value)

    return apply


def _raw_operator_put(tx: RunTarget, run: Run) -> None:
    for subtask, partitions in zip(run.args.subtasks or [], run.args.values or [], strict=True):
        tx.raw_operator.replace(run.state, subtask, partitions)


# The operations that name no state: timers' and raw state's.
_OTHER_RUNS: dict[str, Callable[[RunTarget, Run], list[Any] | None]] = {
    "register_timer": _timers(delete=False),
    "delete_timer": _timers(delete=True),
    FIRE: _fire,
    "raw_get": lambda tx, r: [tx.raw_keyed.get(kg) for kg in r.rows.key_groups],
    "raw_put": _raw_keyed(RawKeyedState.replace),
    "raw_append": _raw_keyed(RawKeyedState.append),
    "raw_delete": _raw_keyed(lambda raw, kg, _value: raw.clear(kg)),
    "raw_operator_get": lambda tx, r: [tx.raw_operator.partitions(r.state, s) for s in r.args.subtasks or []],
    "raw_operator_put": _raw_operator_put,
}
