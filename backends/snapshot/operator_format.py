"""Operator state in a snapshot: list states with their modes, broadcast maps, job metadata,
read from a partition and redistributed for a restore (the file's format, which a reader
without a server shares, is :mod:`statehouse.snapshots.operator_format`).
"""

from __future__ import annotations

from collections.abc import Iterator

import msgpack

from statehouse.backends.base.partition import FrozenView, StorePartition, WriteOp
from statehouse.backends.operator_state import (
    OPERATOR_NAMES_META,
    OPERATOR_SUBTASKS_META,
    decode_names,
    encode_names,
    operator_names_row,
    operator_subtasks_row,
)
from statehouse.backends.raw_state import operator_of
from statehouse.backends.redistribution import OperatorSubtaskState, check_parallelism, redistribute
from statehouse.backends.reserved import (
    BROADCAST_TABLE,
    LIST_MODE_META,
    LIST_TABLE,
    META_TABLE,
    NO_KEY_GROUP,
    STAGED_OPERATOR_META,
    STATE_META,
)
from statehouse.snapshots.errors import SnapshotCorrupt
from statehouse.snapshots.operator_format import OperatorStateData
from statehouse.snapshots.stored.codec import decode_fields, encode_fields


class OperatorSnapshot(OperatorStateData):
    """The operator state of one replica part, as stored bytes (the format is
    :class:`~statehouse.snapshots.operator_format.OperatorStateData`'s); read from a partition."""

    @classmethod
    def from_view(cls, view: FrozenView | StorePartition) -> OperatorSnapshot:
        """The operator state a frozen view (or a partition) holds: list states per subtask, their
        modes, broadcast states, and the job's other metadata rows (writer epochs among them; not
        the state descriptors)."""
        snap = cls()
        tables = view.tables()
        if LIST_TABLE in tables:
            for primary, _secondary, value in view.scan(LIST_TABLE, NO_KEY_GROUP):
                operator, name, subtask = decode_fields(primary, 3)
                snap.lists[(operator, name, int(subtask))] = value
        if BROADCAST_TABLE in tables:
            for primary, secondary, value in view.scan(BROADCAST_TABLE, NO_KEY_GROUP):
                operator, name = decode_fields(primary, 2)
                snap.broadcast.setdefault((operator, name), {})[secondary] = value
        for primary, _secondary, value in view.scan(META_TABLE, NO_KEY_GROUP):
            if primary.startswith(LIST_MODE_META):
                operator, name = decode_fields(primary[len(LIST_MODE_META) :], 2)
                snap.modes[(operator, name)] = value.decode()
            elif not primary.startswith(STATE_META) and primary != STAGED_OPERATOR_META:
                snap.meta[primary] = value
        return snap

    def operator_only(self) -> OperatorSnapshot:
        """This snapshot without the job metadata that is not operator state (writer epochs)."""
        meta = {k: v for k, v in self.meta.items() if k.startswith((OPERATOR_SUBTASKS_META, OPERATOR_NAMES_META))}
        return OperatorSnapshot(dict(self.lists), dict(self.modes), dict(self.broadcast), meta)


def merge_for_replica(
    parts: list[OperatorSnapshot],
    replica_index: int,
    replica_count: int,
    operator_parallelism: dict[str, int] | None = None,
) -> OperatorSnapshot:
    """Operator state for one replica from every part of a snapshot (Flink's ``StateAssignmentOperation``).

    Every operator's list state goes through Flink's ``RoundRobinOperatorStateRepartitioner``
    (:func:`redistribute`), from its old subtask count (:func:`old_subtasks`) to the count named
    in ``operator_parallelism``, else to the same count: split states keep their subtasks unless
    the count changes, union states reach every subtask on every restore. The replica keeps the
    subtasks ``s`` with ``s % replica_count == replica_index``. Broadcast state and job metadata
    go to every replica (the first part holding an entry wins); each operator's recorded subtask
    count becomes the count restored to.
    """
    operator_parallelism = operator_parallelism or {}
    for operator, parallelism in operator_parallelism.items():
        check_parallelism(parallelism, f"operator_parallelism[{operator!r}]")
    merged = OperatorSnapshot()
    recorded: dict[str, int] = {}
    orders: dict[str, dict[int, list[str]]] = {}  # per operator and subtask: its names' order
    for part in parts:
        for state, mode in part.modes.items():
            merged.modes.setdefault(state, mode)
        for state, entries in part.broadcast.items():
            merged.broadcast.setdefault(state, dict(entries))
        for row, value in part.meta.items():
            if row.startswith(OPERATOR_SUBTASKS_META):
                # every replica records the subtasks it saw: the operator's count is the largest
                (operator,) = decode_fields(row[len(OPERATOR_SUBTASKS_META) :], 1)
                recorded[operator] = max(recorded.get(operator, 0), _subtask_count(value))
            elif row.startswith(OPERATOR_NAMES_META):
                operator, sub = decode_fields(row[len(OPERATOR_NAMES_META) :], 2)
                orders.setdefault(operator, {}).setdefault(int(sub), decode_names(value))
            else:
                merged.meta.setdefault(row, value)
        for subtask_list, raw in part.lists.items():
            merged.lists.setdefault(subtask_list, raw)

    stored: dict[str, int] = {}
    for operator, _name, subtask in merged.lists:
        stored[operator] = max(stored.get(operator, 0), subtask + 1)
    for operator, _name in merged.modes:
        stored.setdefault(operator, 0)
    # An operator's raw partitions (a pseudo-operator, ``raw_state``) share its parallelism, as in Flink.
    counted = stored.keys() | recorded.keys()
    olds: dict[str, int] = {}
    for operator in counted:
        base = operator_of(operator)
        olds[base] = max(olds.get(base, 0), stored.get(operator, 0), recorded.get(operator, 0))
    for operator in sorted(counted):
        old = olds[operator_of(operator)]
        new = operator_parallelism.get(operator_of(operator), old)
        order = orders.get(operator, {})
        if old:
            merged.lists, order = _redistributed(merged, operator, old, new, order, replica_index, replica_count)
            merged.meta[operator_subtasks_row(operator)] = str(new).encode()
        for index, names in order.items():
            merged.meta[operator_names_row(operator, index)] = encode_names(names)

    merged.lists = {k: v for k, v in merged.lists.items() if k[2] % replica_count == replica_index}
    return merged


def _subtask_count(value: bytes) -> int:
    try:
        return check_parallelism(int(value), "recorded operator subtask count")
    except Exception as exc:
        raise SnapshotCorrupt(f"unreadable operator subtask count {value!r}: {exc}") from None


def _records(raw: bytes) -> list[bytes]:
    """The stored records of a list, undecoded (Flink: the elements' offsets in the stream)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(raw)
    records, start = [], 0
    while True:
        try:
            unpacker.skip()
        except msgpack.OutOfData:
            break
        end = unpacker.tell()
        records.append(raw[start:end])
        start = end
    if start != len(raw):
        raise SnapshotCorrupt("a truncated operator list state")
    return records


def _redistributed(
    snap: OperatorSnapshot,
    operator: str,
    old_parallelism: int,
    parallelism: int,
    order: dict[int, list[str]],
    replica_index: int,
    replica_count: int,
) -> tuple[dict[tuple[str, str, int], bytes], dict[int, list[str]]]:
    """``snap``'s lists with ``operator``'s redistributed from ``old_parallelism`` to ``parallelism``
    subtasks, of which only those of this replica are kept, and each new subtask's name order
    (the order in which its Flink restore registers its list states).

    Each old subtask is one Flink handle holding every list state of the operator: those it
    wrote in the order it first did (``order``), then the others (as empty lists if it stores
    nothing for them) in name order, then the operator's broadcast states (name order): what a
    Flink subtask running the operator's code snapshots. Elements move as their stored
    records, never decoded.
    """
    names = sorted(name for op, name in snap.modes if op == operator)
    mine = {k: v for k, v in snap.lists.items() if k[0] == operator}
    names += sorted({name for _op, name, _sub in mine} - set(names))
    modes = {name: "union" if snap.modes.get((operator, name)) == "union" else "split" for name in names}
    broadcast = sorted(name for op, name in snap.broadcast if op == operator and name not in modes)
    # Same count, no union state: Flink hands every subtask its own handle back, so the lists
    # stay where they are; only the order each subtask's restore registers names is new.
    unmoved = parallelism == old_parallelism and "union" not in modes.values()
    old = [OperatorSubtaskState() for _ in range(old_parallelism)]
    for sub, state in enumerate(old):
        for name in dict.fromkeys([*(n for n in order.get(sub, ()) if n in modes), *names]):
            raw = None if unmoved else mine.get((operator, name, sub))
            state.lists[name] = (modes[name], [] if raw is None else _records(raw))
        state.broadcast = {name: {} for name in broadcast}  # only their names count here
    new = redistribute(old, parallelism)
    restored = {sub: state.restored_names for sub, state in enumerate(new) if state.restored_names}
    if unmoved:
        return snap.lists, restored
    lists = {k: v for k, v in snap.lists.items() if k[0] != operator}
    unions: dict[str, bytes] = {}  # a union list is the same on every subtask: join it once
    for sub in range(replica_index, parallelism, replica_count):
        for name, (mode, records) in new[sub].lists.items():
            if not records:
                continue
            if mode == "union":
                raw = unions.get(name)
                if raw is None:
                    raw = unions[name] = b"".join(records)
            else:
                raw = b"".join(records)
            lists[(operator, name, sub)] = raw
    return lists, restored


def replace_ops(current: OperatorSnapshot, snap: OperatorSnapshot) -> Iterator[WriteOp]:
    """The writes that replace a partition's operator state ``current`` (as :meth:`OperatorSnapshot.from_view`
    reads it) by ``snap``'s (a live rescale's commit); other job metadata stays."""
    for operator, name, subtask in current.lists:
        yield WriteOp("clear", LIST_TABLE, NO_KEY_GROUP, encode_fields(operator, name, str(subtask)))
    for operator, name in current.modes:
        yield WriteOp("delete", META_TABLE, NO_KEY_GROUP, LIST_MODE_META + encode_fields(operator, name))
    for operator, name in current.broadcast:
        yield WriteOp("clear", BROADCAST_TABLE, NO_KEY_GROUP, encode_fields(operator, name))
    for key in current.operator_only().meta:
        yield WriteOp("delete", META_TABLE, NO_KEY_GROUP, key)
    yield from write_ops(snap.operator_only())


def write_ops(snap: OperatorSnapshot) -> Iterator[WriteOp]:
    """The writes that put an operator snapshot into a (cleared) partition."""
    for (operator, name), mode in snap.modes.items():
        yield WriteOp(
            "put", META_TABLE, NO_KEY_GROUP, LIST_MODE_META + encode_fields(operator, name), value=mode.encode()
        )
    for key, value in snap.meta.items():
        yield WriteOp("put", META_TABLE, NO_KEY_GROUP, key, value=value)
    for (operator, name, subtask), raw in snap.lists.items():
        yield WriteOp("put", LIST_TABLE, NO_KEY_GROUP, encode_fields(operator, name, str(subtask)), value=raw)
    for (operator, name), entries in snap.broadcast.items():
        primary = encode_fields(operator, name)
        for user_key, value in entries.items():
            yield WriteOp("put", BROADCAST_TABLE, NO_KEY_GROUP, primary, user_key, value)
