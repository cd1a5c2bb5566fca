"""Timers for a whole Arrow batch: register or delete one timer per row (what a Spark executor
holds as a record batch), with the rules of ``backends/timers.py``, in one transaction.

Columns: ``key`` (utf8 for ``string`` keys, int32 for ``int``, int64 for ``long``; the key type
is the request's), ``timestamp`` (int64 milliseconds, no nulls) and optionally ``ns`` (utf8,
null meaning ""). Rows apply in order, all or nothing; a row's error names it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import pyarrow as pa

from statehouse.backends.columns import locate, refuse_nulls
from statehouse.backends.descriptors import StateDescriptor
from statehouse.backends.errors import InvalidArgument
from statehouse.backends.job import JobTransaction
from statehouse.backends.timers import TimeDomain, check_domain, check_key_type
from statehouse.keygroups import KEY_TYPES, KeyType

TimerColumnOpName = Literal["register", "delete"]
TIMER_COLUMN_OPS: tuple[str, ...] = get_args(TimerColumnOpName)
_SIGN = np.uint64(1 << 63)


@dataclass(frozen=True, slots=True)
class TimerColumns:
    """One timer operation over the rows of ``columns`` (checked by :meth:`parse`): what a
    columnar timer request asks, and what a task attempt's staged log replays."""

    op: str
    domain: TimeDomain
    key_type: KeyType
    columns: pa.Table

    @property
    def rows(self) -> int:
        return self.columns.num_rows

    @classmethod
    def parse(cls, op: str, domain: str, key_type: str, columns: pa.Table) -> TimerColumns:
        if op not in TIMER_COLUMN_OPS:
            raise InvalidArgument(f"columnar timer operation must be one of {', '.join(TIMER_COLUMN_OPS)}; got {op!r}")
        names = columns.column_names
        if sorted(set(names) - {"ns"}) != ["key", "timestamp"] or len(set(names)) != len(names):
            raise InvalidArgument(f"timers take the columns key, timestamp (and optionally ns); got {', '.join(names)}")
        return cls(op, check_domain(domain), check_key_type(key_type), columns.combine_chunks())


def _timestamps(columns: pa.Table) -> np.ndarray:
    column = columns.column("timestamp").combine_chunks()
    if not pa.types.is_integer(column.type):
        raise InvalidArgument(f"column 'timestamp' must be int64 milliseconds; got {column.type}")
    refuse_nulls(column, "timestamp")
    values = column.to_numpy(zero_copy_only=False)
    if values.dtype == np.uint64 and len(values) and values.max() >= 1 << 63:
        row = int(np.flatnonzero(values >= 1 << 63)[0])
        raise InvalidArgument(f"row {row}: timestamp is beyond 64 bits", row=row)
    return values.astype(np.int64)


def apply_timer_columns(tx: JobTransaction, op: TimerColumns) -> None:
    """Register or delete the timers of every row of ``op`` inside ``tx``."""
    if op.rows == 0:
        return
    timestamps = _timestamps(op.columns)
    # The rows' key groups and stored keys, checked as a state of this key type checks them.
    rows = locate(tx.job, StateDescriptor("timers", "value", key_type=op.key_type), op.columns)
    stamps = (timestamps.view(np.uint64) ^ _SIGN).astype(">u8").view("V8").tolist()  # the sort-ordered prefix
    tag = bytes([KEY_TYPES.index(op.key_type)])
    primaries = list(map(operator.add, (s + tag for s in stamps), rows.primaries))
    tx.timers.write_many(op.domain, rows.key_groups, primaries, delete=op.op == "delete")
