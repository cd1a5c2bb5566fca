"""Operator (non-keyed) state: list state per (operator, subtask) and broadcast state.

List state has a redistribution mode, fixed when the state is first written:
``split`` (Flink's SPLIT_DISTRIBUTE, even split on rescale) or ``union`` (every subtask
gets all elements). Broadcast state is one map per (operator, name), the same on every
subtask. Both live in the job's partition, outside key groups.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from statehouse.backends.base.partition import StorePartition
from statehouse.backends.base.transaction import PartitionTransaction
from statehouse.backends.errors import OperatorStateConflict
from statehouse.backends.limits import AnswerMeter, Limits
from statehouse.backends.redistribution import check_subtask
from statehouse.backends.reserved import BROADCAST_TABLE, LIST_MODE_META, LIST_TABLE, META_TABLE, NO_KEY_GROUP
from statehouse.protocol.errors import InvalidArgument, InvalidValue
from statehouse.snapshots.stored.codec import (
    decode_fields,
    decode_value,
    encode_fields,
    encode_user_key,
    encode_value,
    iter_values,
)
from statehouse.snapshots.stored.names import validate_name

ListMode = Literal["split", "union"]
LIST_MODES: tuple[ListMode, ...] = ("split", "union")

# Row of the job's "$meta": + encoded operator -> its subtask count (decimal), at least one more than
# the highest subtask that wrote (or cleared) one of its lists, so a snapshot knows the operator's
# old parallelism even when its last subtasks hold nothing (Flink counts them when it
# redistributes); a restore sets it to the parallelism it restores to. Snapshots made before it
# existed restore with the highest stored subtask + 1.
OPERATOR_SUBTASKS_META = b"operator-subtasks:"


def operator_subtasks_row(operator: str) -> bytes:
    return OPERATOR_SUBTASKS_META + encode_fields(operator)


# Row of "$meta": + encoded (operator, subtask) -> the names of the operator's lists that subtask
# wrote or cleared, in the order it first did ("/"-joined: names hold no "/"). Flink walks a
# subtask's names in the order of a HashMap filled in that subtask's registration order, so on
# a rescale elements land by it; a restore records the order it gave each new subtask.
OPERATOR_NAMES_META = b"operator-names:"


def operator_names_row(operator: str, subtask: int) -> bytes:
    return OPERATOR_NAMES_META + encode_fields(operator, str(subtask))


def encode_names(names: Iterable[str]) -> bytes:
    return "/".join(names).encode()


def decode_names(raw: bytes) -> list[str]:
    return raw.decode().split("/") if raw else []


def count_subtask(tx: PartitionTransaction, operator: str, subtask: int, name: str) -> None:
    """Record that ``subtask`` wrote ``name``: the subtask count, and the subtask's name order."""
    row = operator_subtasks_row(operator)
    known = tx.get(META_TABLE, NO_KEY_GROUP, row)
    if known is None or int(known) <= subtask:
        tx.put(META_TABLE, NO_KEY_GROUP, row, str(subtask + 1).encode())
    row = operator_names_row(operator, subtask)
    names = decode_names(tx.get(META_TABLE, NO_KEY_GROUP, row) or b"")
    if name not in names:
        tx.put(META_TABLE, NO_KEY_GROUP, row, encode_names([*names, name]))


class OperatorState:
    """Operator state of one job, bound to one transaction."""

    def __init__(self, tx: PartitionTransaction, limits: Limits, answer: AnswerMeter | None = None) -> None:
        self._tx = tx
        self._limits = limits
        self._answer = answer if answer is not None else AnswerMeter(limits.max_answer_bytes)

    def _encode(self, value: Any) -> bytes:
        encoded = encode_value(value)
        self._limits.check_value(encoded)
        return encoded

    # -- list state ----------------------------------------------------------------------

    @staticmethod
    def _list_primary(operator: str, subtask: int, name: str) -> bytes:
        validate_name(operator, "operator")
        validate_name(name, "operator state")
        return encode_fields(operator, name, str(check_subtask(subtask)))

    def list_mode(self, operator: str, name: str) -> ListMode | None:
        raw = self._tx.get(META_TABLE, NO_KEY_GROUP, LIST_MODE_META + encode_fields(operator, name))
        return raw.decode() if raw is not None else None  # type: ignore[return-value]

    def _declare(self, operator: str, name: str, mode: ListMode | None) -> None:
        """Fix the list's mode on its first write; ``None`` takes the stored one (``split`` when
        there is none yet, as Flink's ``getListState``), another than the stored one is refused."""
        if mode is not None and mode not in LIST_MODES:
            raise InvalidArgument(f"mode must be one of {', '.join(LIST_MODES)}; got {mode!r}")
        existing = self.list_mode(operator, name)
        if existing is None:
            declared: ListMode = mode or "split"
            self._tx.put(META_TABLE, NO_KEY_GROUP, LIST_MODE_META + encode_fields(operator, name), declared.encode())
        elif mode is not None and existing != mode:
            raise OperatorStateConflict(
                f"operator list state {operator}/{name} exists with mode {existing!r}; it cannot become {mode!r}"
            )

    def _count_subtask(self, operator: str, subtask: int, name: str) -> None:
        count_subtask(self._tx, operator, subtask, name)

    def name_order(self, operator: str, subtask: int) -> list[str]:
        """The names of ``operator``'s lists ``subtask`` wrote, in the order it first did."""
        return decode_names(self._tx.get(META_TABLE, NO_KEY_GROUP, operator_names_row(operator, subtask)) or b"")

    def subtask_count(self, operator: str) -> int | None:
        """The operator's recorded subtask count (see ``OPERATOR_SUBTASKS_META``), if any."""
        known = self._tx.get(META_TABLE, NO_KEY_GROUP, operator_subtasks_row(operator))
        return None if known is None else int(known)

    def list_get(self, operator: str, subtask: int, name: str) -> list[Any] | None:
        raw = self._tx.get(LIST_TABLE, NO_KEY_GROUP, self._list_primary(operator, subtask, name))
        if raw is None:
            return None
        self._answer.charge(len(raw))
        return list(iter_values(raw))

    def _records(
        self, operator: str, subtask: int, name: str, values: Iterable[Any], mode: ListMode | None
    ) -> tuple[bytes, bytes]:
        """Validate a write and declare the mode; the stored key and the new elements' records."""
        primary = self._list_primary(operator, subtask, name)
        elements = _elements(values)
        self._declare(operator, name, mode)
        return primary, b"".join(self._encode(v) for v in elements)

    def list_update(
        self, operator: str, subtask: int, name: str, values: Iterable[Any], mode: ListMode | None = None
    ) -> None:
        primary, records = self._records(operator, subtask, name, values, mode)
        self._limits.check_operator_list(len(records), f"operator list state {operator}/{subtask}/{name}")
        self._count_subtask(operator, subtask, name)
        if records:
            self._tx.put(LIST_TABLE, NO_KEY_GROUP, primary, records)
        else:
            self._tx.clear(LIST_TABLE, NO_KEY_GROUP, primary)

    def list_add(
        self, operator: str, subtask: int, name: str, values: Iterable[Any], mode: ListMode | None = None
    ) -> None:
        primary, records = self._records(operator, subtask, name, values, mode)
        self._count_subtask(operator, subtask, name)
        if records:
            existing = self._tx.get(LIST_TABLE, NO_KEY_GROUP, primary) or b""
            # Checked before the list is rebuilt: a refused append copies nothing.
            self._limits.check_operator_list(
                len(existing) + len(records), f"operator list state {operator}/{subtask}/{name}"
            )
            self._tx.put(LIST_TABLE, NO_KEY_GROUP, primary, existing + records)

    def list_clear(self, operator: str, subtask: int, name: str) -> None:
        primary = self._list_primary(operator, subtask, name)
        self._count_subtask(operator, subtask, name)
        self._tx.clear(LIST_TABLE, NO_KEY_GROUP, primary)

    # -- broadcast state -----------------------------------------------------------------

    @staticmethod
    def _broadcast_primary(operator: str, name: str) -> bytes:
        validate_name(operator, "operator")
        validate_name(name, "broadcast state")
        return encode_fields(operator, name)

    def broadcast_get(self, operator: str, name: str, key: str) -> Any:
        raw = self._tx.get(BROADCAST_TABLE, NO_KEY_GROUP, self._broadcast_primary(operator, name), encode_user_key(key))
        return None if raw is None else decode_value(raw)

    def broadcast_put(self, operator: str, name: str, key: str, value: Any) -> None:
        if value is None:
            raise InvalidValue("broadcast values must not be null; remove the entry instead")
        primary = self._broadcast_primary(operator, name)
        user_key = encode_user_key(key)
        self._limits.check_key(user_key, "broadcast key")
        self._tx.put(BROADCAST_TABLE, NO_KEY_GROUP, primary, self._encode(value), user_key)

    def broadcast_remove(self, operator: str, name: str, key: str) -> None:
        primary = self._broadcast_primary(operator, name)
        self._tx.delete(BROADCAST_TABLE, NO_KEY_GROUP, primary, encode_user_key(key))

    def broadcast_entries(self, operator: str, name: str) -> dict[str, Any]:
        primary = self._broadcast_primary(operator, name)
        stored = self._answer.items(self._tx.items(BROADCAST_TABLE, NO_KEY_GROUP, primary))
        return {s.decode(): decode_value(v) for s, v in stored}


def operator_contents(
    partition: StorePartition, operator: str
) -> tuple[list[tuple[str, ListMode, list[int]]], list[str]]:
    """What ``partition`` stores of ``operator``: its list states as ``(name, mode, subtasks
    holding elements)`` and its broadcast states' names, in name order (for a reader that lists
    before it reads, as the Spark data source does). Hold the job's lock: the iterators read the
    live partition."""
    validate_name(operator, "operator")
    prefix = encode_fields(operator)
    tables = partition.tables()
    subtasks: dict[str, list[int]] = {}
    if LIST_TABLE in tables:
        for primary in partition.primaries_from(LIST_TABLE, NO_KEY_GROUP, None):
            if primary.startswith(prefix):
                _operator, name, subtask = decode_fields(primary, 3)
                subtasks.setdefault(name, []).append(int(subtask))
    lists: list[tuple[str, ListMode, list[int]]] = []
    for name, subs in sorted(subtasks.items()):
        stored = partition.get(META_TABLE, NO_KEY_GROUP, LIST_MODE_META + encode_fields(operator, name))
        mode: ListMode = "union" if stored == b"union" else "split"
        lists.append((name, mode, sorted(subs)))
    broadcast: set[str] = set()
    if BROADCAST_TABLE in tables:  # a map table: its entries, which broadcast state keeps few of
        for primary, _secondary, _value in partition.scan(BROADCAST_TABLE, NO_KEY_GROUP):
            if primary.startswith(prefix):
                broadcast.add(decode_fields(primary, 2)[1])
    return lists, sorted(broadcast)


def _elements(values: Iterable[Any]) -> list[Any]:
    elements = list(values)
    if any(v is None for v in elements):
        raise InvalidValue("operator list elements must not be null")
    return elements
