"""Timers for a whole Arrow batch: register or delete one timer per row (what a Spark executor
holds as a record batch), with the rules of ``backends/timers.py``, in one transaction.

Columns: ``key`` (utf8 for ``string`` keys, int32 for ``int``, int64 for ``long``; the key type
is the request's), ``timestamp`` (int64 milliseconds, no nulls) and optionally ``ns`` (utf8,
null meaning ""). Rows apply in order, all or nothing; a row's error names it.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pyarrow as pa

from statehouse.backends.columns import namespaces, refuse_nulls
from statehouse.backends.job import JobTransaction
from statehouse.backends.runs import Run, apply_run
from statehouse.backends.staging import STAGED_ROW_OVERHEAD
from statehouse.backends.timers import TimeDomain, check_domain, check_key_type
from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.keygroups import KeyType
from statehouse.protocol.ops import TIMER_COLUMN_OPS, TIMER_COLUMNS


class TimerColumns:
    """One timer operation over the rows of ``columns`` (checked by :meth:`parse`): what a
    columnar timer request asks (``attempts.Work``), applied as one run."""

    STAGED_OVERHEAD: ClassVar[int] = STAGED_ROW_OVERHEAD
    held_bytes = 0  # the run's memory is in the request's bytes and the overhead per row

    def __init__(self, op: str, domain: TimeDomain, key_type: KeyType, columns: pa.Table) -> None:
        self.op, self.domain, self.key_type, self.columns = op, domain, key_type, columns

    @property
    def rows(self) -> int:
        return self.columns.num_rows

    def apply(self, tx: JobTransaction) -> None:
        if self.rows:
            apply_run(tx, timer_run(tx, self))

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


def timer_run(tx: JobTransaction, op: TimerColumns) -> Run:
    """The run of ``op``: its rows checked and located, the timers' stored keys."""
    timestamps = _timestamps(op.columns)
    rows = tx.job.keyspace.locate_timer_column(
        op.columns.column("key").combine_chunks(), op.key_type, namespaces(op.columns), timestamps
    )
    return Run(op.domain, TIMER_COLUMN_OPS[op.op], rows)
