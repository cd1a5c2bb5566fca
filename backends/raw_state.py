"""Raw state: bytes a client lays out itself, moved by Statehouse with their key group or subtask.

Flink's raw keyed state is one stream per key group (``KeyedStateCheckpointOutputStream``,
read back as ``rawKeyedStateInputs``); raw operator state is a list of partitions per subtask
(``OperatorStateCheckpointOutputStream``), repartitioned round-robin on restore. Here:

- **Raw keyed**: per key group one stream, a row of the flat keyed table
  ``reserved.RAW_KEYED_TABLE``. Like timers it is stored under its key group, so a full or
  savepoint snapshot writes it into that key group's section (whose offset the handle records),
  a RocksDB incremental checkpoint carries it in its SST files, and a restore gives each replica
  the streams of exactly the key groups it owns.
- **Raw operator**: per (operator, subtask) a list of partitions, stored as a split list named
  ``DEFAULT_NAME`` of the pseudo-operator ``RAW_OPERATOR_PREFIX + operator``: Flink's raw operator
  handle is exactly that (one ``SPLIT_DISTRIBUTE`` entry named ``_default_``), repartitioned by
  the same ``RoundRobinOperatorStateRepartitioner`` in a call of its own. The pseudo-operator
  keeps that call apart from the operator's managed lists (``operator_format.merge_for_replica``
  gives both the operator's one parallelism).

Both are bounded per record by ``Limits.max_raw_stream_bytes``, counted in the client's bytes (a
stream's length, the sum of a subtask's partitions' lengths): every append rewrites the record and
every read returns it whole.
"""

from __future__ import annotations

from typing import Protocol

import msgpack

from statehouse.backends.base.partition import StorePartition
from statehouse.backends.base.transaction import PartitionTransaction
from statehouse.backends.keyspace import KeySpace, Rows
from statehouse.backends.limits import AnswerMeter, Limits
from statehouse.backends.operator_state import count_subtask
from statehouse.backends.redistribution import check_subtask
from statehouse.backends.reserved import LIST_TABLE, NO_KEY_GROUP, RAW_KEYED_TABLE, RAW_OPERATOR_PREFIX
from statehouse.protocol.errors import InvalidValue
from statehouse.snapshots.stored.codec import encode_fields, iter_values
from statehouse.snapshots.stored.names import validate_name

DEFAULT_NAME = "_default_"  # Flink's DefaultOperatorStateBackend.DEFAULT_OPERATOR_STATE_NAME
_STREAM = b"stream"  # the primary key of a key group's stream (one per key group)


def raw_operator(operator: str) -> str:
    """The pseudo-operator under which ``operator``'s raw partitions are stored."""
    return RAW_OPERATOR_PREFIX + operator


def operator_of(stored: str) -> str:
    """The operator a stored operator name belongs to (itself, or the one of a raw pseudo-operator)."""
    return stored[len(RAW_OPERATOR_PREFIX) :] if stored.startswith(RAW_OPERATOR_PREFIX) else stored


class RawKeyedOwner(Protocol):
    """What raw keyed state needs of a job (``backends.job.Job`` is one): its key space (the key
    groups, and the one owner check keyed requests use: 421 ``key_not_owned``) and its partition."""

    keyspace: KeySpace

    @property
    def partition(self) -> StorePartition: ...


class RawKeyedState:
    """Raw keyed streams of one job, bound to one transaction."""

    def __init__(self, job: RawKeyedOwner, tx: PartitionTransaction, limits: Limits, answer: AnswerMeter) -> None:
        self._job = job
        self._tx = tx
        self._limits = limits
        self._answer = answer

    def _key_group(self, key_group: int) -> int:
        """A key group of the job this replica owns (422 out of range, 421 another replica's)."""
        self._job.keyspace.check_key_group(key_group, "key group")
        return key_group

    def locate(self, key_group: int) -> Rows:
        """Where the stream of ``key_group`` is stored, checked (a batch's raw operation's row)."""
        return Rows([self._key_group(key_group)], [_STREAM])

    def _table(self, create: bool) -> bool:
        """Whether the table is there; made on first write (a job without raw state has none)."""
        partition = self._job.partition
        if RAW_KEYED_TABLE in partition.tables():
            return True
        if create:
            partition.create_table(RAW_KEYED_TABLE, nested=False)  # an empty table: harmless if this rolls back
        return create

    def get(self, key_group: int) -> bytes | None:
        """The key group's stream, or ``None`` when nothing was written (Flink's input for it is empty)."""
        key_group = self._key_group(key_group)
        if not self._table(create=False):
            return None
        stream = self._tx.get(RAW_KEYED_TABLE, key_group, _STREAM)
        if stream is not None:
            self._answer.charge(len(stream))
        return stream

    def replace(self, key_group: int, data: bytes) -> None:
        key_group = self._key_group(key_group)
        self._write(key_group, data)

    def append(self, key_group: int, data: bytes) -> int:
        """Append a part; the stream's new length."""
        key_group = self._key_group(key_group)
        existing = (self._tx.get(RAW_KEYED_TABLE, key_group, _STREAM) if self._table(create=False) else None) or b""
        # Checked before the two are joined: a refused append allocates nothing more.
        self._limits.check_raw_stream(len(existing) + len(data), f"the raw stream of key group {key_group}")
        stream = existing + data
        self._write(key_group, stream)
        return len(stream)

    def clear(self, key_group: int) -> None:
        key_group = self._key_group(key_group)
        if self._table(create=False):
            self._tx.delete(RAW_KEYED_TABLE, key_group, _STREAM)

    def _write(self, key_group: int, stream: bytes) -> None:
        self._limits.check_raw_stream(len(stream), f"the raw stream of key group {key_group}")
        if not stream:
            self.clear(key_group)  # an empty stream is no stream: nothing to snapshot
            return
        self._table(create=True)
        self._tx.put(RAW_KEYED_TABLE, key_group, _STREAM, stream)


class RawOperatorState:
    """Raw operator partitions of one job, bound to one transaction."""

    def __init__(self, tx: PartitionTransaction, limits: Limits, answer: AnswerMeter) -> None:
        self._tx = tx
        self._limits = limits
        self._answer = answer

    @staticmethod
    def _primary(operator: str, subtask: int) -> bytes:
        validate_name(operator, "operator")
        return encode_fields(raw_operator(operator), DEFAULT_NAME, str(check_subtask(subtask)))

    @classmethod
    def locate(cls, operator: str, subtask: int) -> Rows:
        """Where a subtask's partitions are stored, checked (a batch's raw operation's row)."""
        return Rows([NO_KEY_GROUP], [cls._primary(operator, subtask)])

    def partitions(self, operator: str, subtask: int) -> list[bytes]:
        """The subtask's partitions in order (``[]`` when it holds none)."""
        raw = self._tx.get(LIST_TABLE, NO_KEY_GROUP, self._primary(operator, subtask))
        if raw is None:
            return []
        self._answer.charge(len(raw))
        return list(iter_values(raw))

    def add(self, operator: str, subtask: int, partitions: list[bytes]) -> None:
        """Append partitions, after those the subtask holds."""
        self._write(operator, subtask, partitions, replace=False)

    def replace(self, operator: str, subtask: int, partitions: list[bytes]) -> None:
        self._write(operator, subtask, partitions, replace=True)

    def clear(self, operator: str, subtask: int) -> None:
        self._write(operator, subtask, [], replace=True)

    def _write(self, operator: str, subtask: int, partitions: list[bytes], replace: bool) -> None:
        primary = self._primary(operator, subtask)
        if any(not isinstance(p, bytes) for p in partitions):
            raise InvalidValue("raw operator partitions must be bytes (msgpack bin values)")
        existing = b"" if replace else self._tx.get(LIST_TABLE, NO_KEY_GROUP, primary) or b""
        # The limit is on the partitions' own bytes, as a keyed stream's is on its bytes: the
        # record's msgpack framing (up to 5 bytes a partition) is not the client's to count.
        held = sum(len(p) for p in iter_values(existing))
        what = f"the raw operator state of {operator}/{subtask}"
        self._limits.check_raw_stream(held + sum(len(p) for p in partitions), what)
        stored = existing + b"".join(msgpack.packb(p, use_bin_type=True) for p in partitions)
        # Counted even when it stores nothing: a restore knows the operator's old parallelism.
        count_subtask(self._tx, raw_operator(operator), subtask, DEFAULT_NAME)
        if stored:
            self._tx.put(LIST_TABLE, NO_KEY_GROUP, primary, stored)
        else:
            self._tx.clear(LIST_TABLE, NO_KEY_GROUP, primary)
