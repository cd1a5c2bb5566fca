"""Columnar keyed state: one operation over many rows given as Arrow columns.

The per-operation vocabulary (``ops``) names one key per operation; a columnar operation
names one state and one operation for a whole table of rows (what a Spark executor holds as
an Arrow record batch). It becomes one run (``runs.Run``), as a batch's operations do, and
runs through the same state kinds and rules — their ``*_many`` methods — inside one
transaction: rows apply in order, all or nothing.

The operations and the columns each takes: ``protocol/ops.py`` (``COLUMN_OPS``; ``ns`` is
optional everywhere, null meaning ""). A list state's ``add`` takes one element per row, or a
list column (addAll); ``put`` on a map takes a map or struct column.

Reads answer a ``value`` column typed by the state's ``value_type`` (see ``value_types``),
or as Arrow infers it from the values of an untyped state.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from statehouse.backends.columnar_codec import Packed, pack_column, unpack_column
from statehouse.backends.job import JobTransaction
from statehouse.backends.keyed import KeyedState, ListState, Rows, ValueState
from statehouse.backends.runs import Run, RunArgs, apply_run
from statehouse.backends.staging import STAGED_ROW_OVERHEAD
from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.ops import ANSWERING_COLUMN_OPS, COLUMN_OPS, OPS
from statehouse.snapshots.stored.arrow import to_arrow, value_type
from statehouse.snapshots.stored.codec import decode_many
from statehouse.snapshots.stored.descriptors import StateDescriptor


class _ColumnWork:
    """What a columnar request's op says of it, for one state or several (``attempts.Work``)."""

    STAGED_OVERHEAD: ClassVar[int] = STAGED_ROW_OVERHEAD
    held_bytes = 0  # the run's memory is in the request's bytes and the overhead per row
    op: str

    @property
    def writes(self) -> bool:
        return OPS[self.op].writes

    @property
    def answers(self) -> bool:
        """Whether it answers a value per row (a read, or a write such as ``add_get``)."""
        return self.op in ANSWERING_COLUMN_OPS


class ColumnOp(_ColumnWork):
    """One operation on one state over the rows of ``columns`` (validated by :meth:`parse`):
    what a columnar request asks (``attempts.Work``)."""

    def __init__(self, state: str, op: str, columns: pa.Table) -> None:
        self.state, self.op, self.columns = state, op, columns

    @property
    def rows(self) -> int:
        return self.columns.num_rows

    def apply(self, tx: JobTransaction) -> pa.Array | None:
        return apply_columns(tx, self)

    def answer(self, values: pa.Array) -> pa.Table:
        """What a request that answers sends back: its columns with ``value`` (a read's appended;
        an ``add_get``'s values replaced by each row's result after its add)."""
        names = self.columns.column_names
        if "value" in names:
            return self.columns.set_column(names.index("value"), "value", values)
        return self.columns.append_column("value", values)

    @classmethod
    def parse(cls, state: str, op: str, columns: pa.Table) -> ColumnOp:
        """Check the operation and its columns' names (types are checked against the state)."""
        needed = COLUMN_OPS.get(op)
        if needed is None:
            raise InvalidArgument(f"columnar operation must be one of {', '.join(COLUMN_OPS)}; got {op!r}")
        names = columns.column_names
        missing = [c for c in needed if c not in names]
        unknown = [c for c in names if c not in needed and c != "ns"]
        if missing or unknown or len(set(names)) != len(names):
            raise InvalidArgument(
                f"'{op}' takes the columns {', '.join(needed)} (and optionally ns); got {', '.join(names) or 'none'}"
            )
        return cls(state, op, columns.combine_chunks())


# The value column of each state in a request over several states (``value:total``): state
# names never hold ':' (``names.NAME_PATTERN``), so no column name is read two ways.
STATE_VALUE = "value:"


class StatesColumnOp(_ColumnWork):
    """One operation on several states over the same rows, in one request and transaction: the
    rows' ``key`` (and ``ns``, ``user_key``) columns once, and one value column per state
    (``value:<state>``) for an operation that takes values. It runs as one :class:`ColumnOp` (one
    run) per state, in the order the states are named (``attempts.Work``): the Spark job that
    updates a sum and a count per user sends one request where it sent one per state."""

    def __init__(self, op: str, ops: list[ColumnOp], columns: pa.Table) -> None:
        self.op, self.ops, self.columns = op, ops, columns

    @property
    def rows(self) -> int:
        """Rows times states: the writes it stages, and the work it is (one run per state)."""
        return self.columns.num_rows * len(self.ops)

    def apply(self, tx: JobTransaction) -> list[pa.Array] | None:
        located: dict[str, Rows] = {}  # the rows' keys, encoded and owner-checked once per key type
        values = [apply_columns(tx, op, located) for op in self.ops]
        return values if self.answers else None

    def answer(self, values: list[pa.Array]) -> pa.Table:
        """The rows' shared columns, then each state's ``value:<state>`` (what it read, or its
        result after the add)."""
        shared = [name for name in self.columns.column_names if not name.startswith(STATE_VALUE)]
        table = self.columns.select(shared)
        for op, column in zip(self.ops, values, strict=True):
            table = table.append_column(STATE_VALUE + op.state, column)
        return table

    @classmethod
    def parse(cls, states: list[str], op: str, columns: pa.Table) -> StatesColumnOp:
        """Check the states (one at least, each once), the operation and its columns' names."""
        needed = COLUMN_OPS.get(op)
        if needed is None:
            raise InvalidArgument(f"columnar operation must be one of {', '.join(COLUMN_OPS)}; got {op!r}")
        if not states or len(set(states)) != len(states):
            raise InvalidArgument(f"'states' names the states, each once, comma-separated; got {','.join(states)!r}")
        shared = [c for c in needed if c != "value"]
        values = [STATE_VALUE + state for state in states] if "value" in needed else []
        names = columns.column_names
        missing = [c for c in (*shared, *values) if c not in names]
        unknown = [c for c in names if c not in shared and c not in values and c != "ns"]
        if missing or unknown or len(set(names)) != len(names):
            wanted = ", ".join([*shared, *values])
            raise InvalidArgument(
                f"'{op}' on states {', '.join(states)} takes the columns {wanted} (and optionally ns); "
                f"got {', '.join(names) or 'none'}"
            )
        columns = columns.combine_chunks()
        common = [c for c in names if c in shared or c == "ns"]
        base = [columns.column(c) for c in common]
        ops = []
        for state in states:
            arrays, labels = list(base), list(common)
            if values:
                arrays.append(columns.column(STATE_VALUE + state))
                labels.append("value")
            ops.append(ColumnOp(state, op, pa.Table.from_arrays(arrays, names=labels)))
        return cls(op, ops, columns)


def locate(tx: JobTransaction, descriptor: StateDescriptor, columns: pa.Table) -> Rows:
    """The rows' key groups and stored keys (``KeySpace.locate_column``)."""
    keys = columns.column("key").combine_chunks()
    return tx.job.keyspace.locate_column(keys, descriptor.key_type, namespaces(columns), f"state {descriptor.name!r}")


def namespaces(columns: pa.Table) -> pa.Array | str:
    """The ``ns`` column (null meaning ""), or "" for every row when there is none."""
    return _strings(columns, "ns", "") if "ns" in columns.column_names else ""


def _strings(columns: pa.Table, name: str, null: str | None) -> pa.Array:
    """A utf8 column; nulls become ``null``, or are refused when it is ``None``."""
    column = columns.column(name).combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise InvalidArgument(f"column {name!r} must be utf8 strings; got {column.type}")
    if column.null_count:
        if null is None:
            refuse_nulls(column, name)
        column = column.fill_null(null)
    return column


def refuse_nulls(column: pa.Array, name: str) -> None:
    """``InvalidArgument`` (422) naming the first null row of ``column``, if it has one."""
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise InvalidArgument(f"row {row}: {name} is null", row=row)


def _values(columns: pa.Table) -> list[Any]:
    """The ``value`` column as Python values, maps as dicts at any depth (what a JSON object
    sent per operation is): pyarrow gives them as lists of pairs."""
    column = columns.column("value").combine_chunks()
    values = column.to_pylist()
    return [_maps_as_dicts(v, column.type) for v in values] if _holds_map(column.type) else values


@functools.lru_cache(maxsize=256)
def _holds_map(kind: pa.DataType) -> bool:
    return pa.types.is_map(kind) or any(_holds_map(kind.field(i).type) for i in range(kind.num_fields))


def _maps_as_dicts(value: Any, kind: pa.DataType) -> Any:
    if value is None or not _holds_map(kind):
        return value
    if pa.types.is_map(kind):
        item = kind.item_type
        return dict(value) if not _holds_map(item) else {k: _maps_as_dicts(v, item) for k, v in value}
    if pa.types.is_struct(kind):
        return {f.name: _maps_as_dicts(value[f.name], f.type) for f in kind}
    return [_maps_as_dicts(v, kind.value_type) for v in value]  # a list of some kind


_LIST_TYPES = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)


def _args(state: KeyedState, op: str, columns: pa.Table) -> RunArgs:
    """What the rows carry for ``op``, as the runs take it. A list state's ``add`` takes a
    list column as addAll (one list per row); any other ``add`` adds one value per row."""
    spec = OPS[op]
    user_keys = _strings(columns, "user_key", None).to_pylist() if "user_key" in COLUMN_OPS[op] else None
    values = _values(columns) if "value" in columns.column_names else None
    if not spec.takes_values or values is None:
        return RunArgs(user_keys=user_keys, values=values)
    kind = columns.column("value").type
    if isinstance(state, ListState) and any(test(kind) for test in _LIST_TYPES):
        return RunArgs(user_keys=user_keys, add_lists=_lists(values))
    return RunArgs(user_keys=user_keys, add_values=values)


def _lists(values: list[Any]) -> list[Any]:
    """The rows of an addAll: a null row is a missing argument, as a batch's ``"values": null``."""
    if None in values:
        row = values.index(None)
        raise InvalidArgument("value is null: addAll takes a list (empty to add nothing)").within(f"row {row}", row=row)
    return values


def apply_columns(tx: JobTransaction, op: ColumnOp, located: dict[str, Rows] | None = None) -> pa.Array | None:
    """Run ``op`` inside ``tx`` (as one run); a read (or ``add_get``) answers its ``value``
    column, a write ``None``. ``located``: the rows already located per key type (several
    states' operations over the same rows), added to."""
    state = tx.state(op.state)
    if op.rows == 0:
        return pa.nulls(0, value_type(state.descriptor, op.op) or pa.null()) if op.answers else None
    key_type = state.descriptor.key_type
    rows = located.get(key_type) if located is not None else None
    if rows is None:
        rows = locate(tx, state.descriptor, op.columns)
        if located is not None:
            located[key_type] = rows
    packs = _UNPACKED.get(state.descriptor.value_type)
    if op.op == "get" and packs is not None and isinstance(state, ValueState) and op.rows >= _PACK_MIN_ROWS:
        # A read of a whole column: not a run (reads are not logged), the payloads decoded at once.
        rows = state.accessed(rows)
        stored = state.get_payloads(rows)
        if stored is None:  # a state with a default: one value at a time
            return to_arrow(state.get_many(rows), state.descriptor, op.op)
        column = unpack_column(stored, packs)
        return column if column is not None else to_arrow(decode_many(stored), state.descriptor, op.op)
    packed = _packed(state, op) if op.op == "put" and op.rows >= _PACK_MIN_ROWS else None
    args = RunArgs(packed=packed) if packed is not None else _args(state, op.op, op.columns)
    values = apply_run(tx, Run(op.state, op.op, rows, args))
    return None if values is None else to_arrow(values, state.descriptor, op.op)


# The value types whose columns a read decodes whole (``columnar_codec.unpack_column``).
_UNPACKED: dict[str | None, pa.DataType] = {"binary": pa.binary(), "string": pa.string()}
# Below this many rows, a dozen numpy calls cost more than packing (or decoding) values one by one.
_PACK_MIN_ROWS = 128
# Value columns whose Arrow type is what a value state holds (any of these when it is untyped):
# a put packs them as whole columns, with no Python value per row.
_PACKED_COLUMNS: dict[str | None, tuple[pa.DataType, ...]] = {
    None: (pa.binary(), pa.large_binary(), pa.string(), pa.large_string()),
    "binary": (pa.binary(), pa.large_binary()),
    "string": (pa.string(), pa.large_string()),
}


def _packed(state: KeyedState, op: ColumnOp) -> Packed | None:
    """A value state's ``put`` of a binary or utf8 column of its type: the values' msgpack bytes
    built for the whole column at once (the bytes ``codec.pack_value`` gives; the state applies
    its rules: limits, TTL). ``None`` when the column is not one (the rows go the general way)."""
    if not isinstance(state, ValueState):
        return None
    column = op.columns.column("value").combine_chunks()
    if column.type not in _PACKED_COLUMNS.get(state.descriptor.value_type, ()):
        return None
    return pack_column(column)
