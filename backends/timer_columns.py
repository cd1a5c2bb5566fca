"""Timers for a whole Arrow batch: register or delete one timer per row (what a Spark executor
holds as a record batch), with the rules of ``backends/timers.py``, in one transaction.

Columns: ``key`` (utf8 for ``string`` keys, int32 for ``int``, int64 for ``long``; the key type
is the request's), ``timestamp`` (int64 milliseconds, no nulls) and optionally ``ns`` (utf8,
null meaning ""). Rows apply in order, all or nothing; a row's error names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pyarrow as pa

from statehouse.backends.columns import namespaces, refuse_nulls
from statehouse.backends.errors import InvalidArgument
from statehouse.backends.job import JobTransaction
from statehouse.backends.staging import STAGED_ROW_OVERHEAD, StagedWrite
from statehouse.backends.timers import TimeDomain, check_domain, check_key_type
from statehouse.keygroups import KeyType
from statehouse.protocol.ops import TIMER_COLUMN_OPS, TIMER_COLUMNS


@dataclass(frozen=True, slots=True)
class TimerColumns:
    """One timer operation over the rows of ``columns`` (checked by :meth:`parse`): what a
    columnar timer request asks, and what a task attempt's staged log replays."""

    STAGED_OVERHEAD: ClassVar[int] = STAGED_ROW_OVERHEAD

    op: str
    domain: TimeDomain
    key_type: KeyType
    columns: pa.Table

    @property
    def rows(self) -> int:
        return self.columns.num_rows

    @property
    def held_bytes(self) -> int:
        return 0  # its rows stay in the request's Arrow table, counted as request bytes

    def apply(self, tx: JobTransaction) -> None:
        apply_timer_columns(tx, self)

    def staged(self) -> list[StagedWrite]:
        return [self]

    @classmethod
    def replay(cls, tx: JobTransaction, writes: Sequence[TimerColumns]) -> None:
        for write in writes:
            apply_timer_columns(tx, write)

    @classmethod
    def parse(cls, op: str, domain: str, key_type: str, columns: pa.Table) -> TimerColumns:
        if op not in TIMER_COLUMN_OPS:
            raise InvalidArgument(f"columnar timer operation must be one of {', '.join(TIMER_COLUMN_OPS)}; got {op!r}")
        names = columns.column_names
        if sorted(set(names) - {"ns"}) != sorted(TIMER_COLUMNS) or len(set(names)) != len(names):
            raise InvalidArgument(
                f"timers take the columns {', '.join(TIMER_COLUMNS)} (and optionally ns); got {', '.join(names)}"
            )
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
    rows = tx.job.keyspace.locate_timer_column(
        op.columns.column("key").combine_chunks(), op.key_type, namespaces(op.columns), timestamps
    )
    tx.timers.write_many(op.domain, rows.key_groups, rows.primaries, delete=op.op == "delete")
