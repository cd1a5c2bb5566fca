"""The operations of the API by name: one table, shared by the server (which runs them) and the
client (which batches, retries and counts them). Every door takes them: the one-key routes, the
batch (``{"op": ..., "state": ..., "key": ...}``), the columnar endpoint (one operation over a
table of rows) and the timer endpoints. What each means per state kind:

====================  ===================================================================
``get``               value / list / whole map / reduced / aggregated result
``put``               value: update (``None`` clears); list: replace (a list); map:
                      replace all (an object)
``add``               list: add (``value``) or addAll (``values``); reducing/aggregating:
                      add
``add_get``           reducing/aggregating: ``add``, answering each row's result after its
                      add (Redis's INCRBY): one request and one lookup instead of an
                      ``add`` and a ``get``. Staged under a task attempt, it answers the
                      committed value folded with that attempt's own staged adds: what the
                      key holds once the epoch commits if no other winner adds to it
``clear``             any kind
``map_get``           ``map_put``, ``map_remove``, ``map_contains``: one map entry
                      (``user_key``)
``map_add``           fold ``value`` (or each of ``values``) into one map entry with the
                      map's ``function``; a map registered without one refuses it
``register_timer``    ``delete_timer``: a timer (``domain``: event | processing, ``key``,
                      ``key_type`` (default string), ``ns``, ``timestamp``); no state
``raw_get``           ``raw_put`` (replace; empty clears), ``raw_append``, ``raw_delete``:
                      the raw keyed stream of ``key_group`` (bytes ``value``); no state
``raw_operator_get``  ``raw_operator_put`` (replace; ``[]`` clears): the raw partitions of
                      ``operator``'s ``subtask`` (``value``: a list of bytes); no state
====================  ===================================================================

Columnar form: the same names, with the fields as columns (``ns`` optional everywhere, null
meaning ""); timers' columnar form is ``register`` / ``delete`` over ``key`` and ``timestamp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

# The kinds of keyed state (Flink's ValueState, ListState, MapState, ReducingState, AggregatingState):
# the one definition the stored descriptors, the HTTP models and the client share.
StateKind = Literal["value", "list", "map", "reducing", "aggregating"]
STATE_KINDS: tuple[StateKind, ...] = get_args(StateKind)
_ALL_KINDS: frozenset[str] = frozenset(STATE_KINDS)
# What an operation reads or writes: a keyed state's key, a timer, a key group's raw stream, or
# an operator subtask's raw partitions (the client routes each by it).
Target = Literal["state", "timer", "raw_keyed", "raw_operator"]


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: whether it writes (a task attempt stages its writes), whether repeating it
    cannot change the outcome (a batch of only these may be retried after a timeout), what it
    carries besides ``state``, ``key`` and ``ns``, its columns when it has a columnar form, and
    the state kinds that take it (only a state operation has kinds), what it acts on, and
    whether a write answers values too."""

    name: str
    writes: bool
    idempotent: bool
    fields: tuple[str, ...] = ()  # required fields of a batch operation
    takes_values: bool = False  # ``values`` (a list) may stand for ``value``: add them in order
    columns: tuple[str, ...] | None = None  # columns of its columnar form (besides ``ns``)
    kinds: frozenset[str] = frozenset()
    target: Target = "state"
    answers: bool = False  # a write that answers a value per row (as reads do)


_MAP = frozenset({"map"})
_TABLE = (
    Op("get", writes=False, idempotent=True, columns=("key",), kinds=_ALL_KINDS),
    Op(
        "put",
        writes=True,
        idempotent=True,
        fields=("value",),
        columns=("key", "value"),
        kinds=frozenset({"value", "list", "map"}),
    ),
    Op(
        "add",
        writes=True,
        idempotent=False,
        fields=("value",),
        takes_values=True,
        columns=("key", "value"),
        kinds=frozenset({"list", "reducing", "aggregating"}),
    ),
    Op(
        "add_get",
        writes=True,
        idempotent=False,
        fields=("value",),
        takes_values=True,
        columns=("key", "value"),
        kinds=frozenset({"reducing", "aggregating"}),
        answers=True,
    ),
    Op("clear", writes=True, idempotent=True, columns=("key",), kinds=_ALL_KINDS),
    Op("map_get", writes=False, idempotent=True, fields=("user_key",), columns=("key", "user_key"), kinds=_MAP),
    Op(
        "map_put",
        writes=True,
        idempotent=True,
        fields=("user_key", "value"),
        columns=("key", "user_key", "value"),
        kinds=_MAP,
    ),
    Op(
        "map_add",
        writes=True,
        idempotent=False,
        fields=("user_key", "value"),
        takes_values=True,
        columns=("key", "user_key", "value"),
        kinds=_MAP,
    ),
    Op("map_remove", writes=True, idempotent=True, fields=("user_key",), columns=("key", "user_key"), kinds=_MAP),
    Op("map_contains", writes=False, idempotent=True, fields=("user_key",), kinds=_MAP),
    Op("register_timer", writes=True, idempotent=True, fields=("timestamp",), target="timer"),
    Op("delete_timer", writes=True, idempotent=True, fields=("timestamp",), target="timer"),
    Op("raw_get", writes=False, idempotent=True, fields=("key_group",), target="raw_keyed"),
    Op("raw_put", writes=True, idempotent=True, fields=("key_group", "value"), target="raw_keyed"),
    Op("raw_append", writes=True, idempotent=False, fields=("key_group", "value"), target="raw_keyed"),
    Op("raw_delete", writes=True, idempotent=True, fields=("key_group",), target="raw_keyed"),
    Op("raw_operator_get", writes=False, idempotent=True, fields=("operator", "subtask"), target="raw_operator"),
    Op(
        "raw_operator_put",
        writes=True,
        idempotent=True,
        fields=("operator", "subtask", "value"),
        target="raw_operator",
    ),
)
OPS: dict[str, Op] = {op.name: op for op in _TABLE}

# The names as types (the HTTP models' enums, the engine's signatures); checked below against
# the table, so the two cannot drift.
StateOpName = Literal[
    "get", "put", "add", "add_get", "clear", "map_get", "map_put", "map_add", "map_remove", "map_contains"
]
TimerOpName = Literal["register_timer", "delete_timer"]
RawOpName = Literal["raw_get", "raw_put", "raw_append", "raw_delete", "raw_operator_get", "raw_operator_put"]
ColumnOpName = Literal["get", "put", "add", "add_get", "clear", "map_get", "map_put", "map_add", "map_remove"]
TimerColumnOpName = Literal["register", "delete"]

STATE_OPS: tuple[str, ...] = tuple(op.name for op in _TABLE if op.target == "state")
TIMER_OPS: tuple[str, ...] = tuple(op.name for op in _TABLE if op.target == "timer")
RAW_OPS: tuple[str, ...] = tuple(op.name for op in _TABLE if op.target in ("raw_keyed", "raw_operator"))
OP_NAMES: tuple[str, ...] = tuple(OPS)
READ_OPS: frozenset[str] = frozenset(op.name for op in _TABLE if not op.writes)
IDEMPOTENT_OPS: frozenset[str] = frozenset(op.name for op in _TABLE if op.idempotent)
COLUMN_OPS: dict[str, tuple[str, ...]] = {op.name: op.columns for op in _TABLE if op.columns is not None}
READ_COLUMN_OPS: frozenset[str] = frozenset(COLUMN_OPS) & READ_OPS
# The operations whose answer is a value per row: the reads, and writes such as ``add_get``.
ANSWERING_OPS: frozenset[str] = READ_OPS | frozenset(op.name for op in _TABLE if op.answers)
ANSWERING_COLUMN_OPS: frozenset[str] = frozenset(COLUMN_OPS) & ANSWERING_OPS
# A timer's columnar form names its batch operation's verb; its columns are these.
TIMER_COLUMN_OPS: dict[str, str] = {"register": "register_timer", "delete": "delete_timer"}
TIMER_COLUMNS: tuple[str, ...] = ("key", "timestamp")

for _names, _type in (
    (STATE_OPS, StateOpName),
    (TIMER_OPS, TimerOpName),
    (RAW_OPS, RawOpName),
    (tuple(COLUMN_OPS), ColumnOpName),
    (tuple(TIMER_COLUMN_OPS), TimerColumnOpName),
):
    if _names != get_args(_type):  # pragma: no cover - a table edited without its type
        raise AssertionError(f"protocol.ops: {_type} lists {get_args(_type)}, the table {_names}")
