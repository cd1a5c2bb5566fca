"""Timers for whole columns: register or delete one timer per row, one Arrow request per replica
(``TimerServiceHandle.register_many`` / ``delete_many``). Like ``client/columns.py`` it needs the
client's ``columnar`` extra (pyarrow, numpy, pandas) and loads only when used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import pyarrow as pa

from statehouse.client.arrow import (
    as_array,
    checked_length,
    chunk_rows,
    ipc_stream,
    key_column,
    namespace_column,
    no_nulls,
)
from statehouse.client.errors import InvalidRequest, StatehouseError
from statehouse.protocol import routes
from statehouse.protocol.keygroups import KeyGroupRange, KeyType
from statehouse.protocol.keygroups.columnar import key_groups, operator_indexes

if TYPE_CHECKING:
    from statehouse.client.attempts import TaskAttempt
    from statehouse.client.batch import Batch
    from statehouse.client.replicas import Replicas


class TimerJob(Protocol):
    """What timers need of their job (a ``JobClient``); ``client/timers.py`` uses it too (it is
    here, not there, so that neither module needs the other to be understood)."""

    name: str
    replicas: Replicas
    max_parallelism: int

    def batch(self) -> Batch: ...

    def key_group_range(self, replica: int) -> KeyGroupRange: ...


def _timestamps(timestamps: Any, rows: int) -> pa.Array:
    array = checked_length(as_array(timestamps, "timestamp"), "timestamp", rows)
    if not (pa.types.is_integer(array.type) or pa.types.is_null(array.type)):
        raise InvalidRequest(f"timestamps must be integers (milliseconds); got {array.type}")
    no_nulls(array, "timestamp")
    try:
        return array.cast(pa.int64())
    except pa.ArrowInvalid as exc:
        raise InvalidRequest(f"timestamps must fit 64 bits: {exc}") from None


def send(
    job: TimerJob,
    domain: str,
    op: str,
    keys: Any,
    timestamps: Any,
    ns: Any,
    key_type: str,
    *,
    attempt: TaskAttempt | None,
    epoch: int | None,
    max_rows: int,
) -> int:
    """Register (``op="register"``) or delete timers, one per row, on the replicas owning their
    keys (the replicas in parallel, each one's rows in order); returns the rows applied."""
    if key_type not in ("string", "int", "long"):
        raise InvalidRequest(f"key_type must be string, int or long; got {key_type!r}")
    typed = cast(KeyType, key_type)
    key_array = key_column(keys, typed, f"timer keys are {key_type}")
    rows = len(key_array)
    columns: dict[str, pa.Array] = {"key": key_array, "timestamp": _timestamps(timestamps, rows)}
    namespace = namespace_column(ns, rows)
    if namespace is not None:
        columns["ns"] = namespace
    table = pa.table(columns)
    count = len(job.replicas)
    owners = (
        operator_indexes(key_groups(key_array, typed, job.max_parallelism), job.max_parallelism, count)
        if count > 1
        else np.zeros(rows, np.int32)
    )
    path = routes.path(routes.TIMER_COLUMNS, job=job.name, domain=domain, op=op)

    def send_rows(replica: int, part: pa.Table) -> None:
        step = chunk_rows(part, max_rows)
        for start in range(0, part.num_rows, step):
            chunk = part.slice(start, step)
            params: dict[str, Any] = {"key_type": key_type}
            if attempt is not None:
                params.update(attempt.fields(replica))
            elif epoch is not None:
                params["epoch"] = epoch
            try:  # registering or deleting again changes nothing: always safe to re-send
                job.replicas[replica].request(
                    "POST",
                    path,
                    idempotent=True,
                    content=bytes(ipc_stream(chunk)),
                    headers={"content-type": routes.ARROW_STREAM},
                    params=params,
                )
            except StatehouseError as exc:
                if attempt is not None and 400 <= (exc.status or 0) < 500:
                    attempt.refused(replica, params["seq"])
                raise
            if attempt is not None:
                attempt.answered(replica, chunk.num_rows)

    sending = [
        job.replicas.send_in_order(replica, send_rows, replica, table.take(pa.array(np.flatnonzero(owners == replica))))
        for replica in range(count)
        if np.any(owners == replica)
    ]
    for future in sending:
        future.result()
    return rows
