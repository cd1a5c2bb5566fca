"""Operator state in a snapshot: list states with their modes, broadcast maps, job metadata.

Flink writes operator state as its own stream (``OperatorStreamStateHandle``); here it is
one small file per replica part: msgpack of the stored bytes, zstd-compressed. Keyed state
descriptors are not in it (they are in the keyed header).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import msgpack

from statehouse.backends.base.partition import FrozenView, WriteOp
from statehouse.backends.codec import decode_fields, encode_fields, encode_value, iter_values
from statehouse.backends.redistribution import OperatorSubtaskState, check_parallelism, check_subtask, redistribute
from statehouse.backends.reserved import (
    BROADCAST_TABLE,
    LIST_MODE_META,
    LIST_TABLE,
    META_TABLE,
    NO_KEY_GROUP,
    STATE_META,
)
from statehouse.snapshots.compression import ZSTD
from statehouse.snapshots.errors import SnapshotCorrupt

_VERSION = 1


@dataclass
class OperatorSnapshot:
    """The operator state of one replica part, as stored bytes."""

    # (operator, name, subtask) -> concatenated msgpack elements
    lists: dict[tuple[str, str, int], bytes] = field(default_factory=dict)
    modes: dict[tuple[str, str], str] = field(default_factory=dict)
    # (operator, name) -> {user key bytes: value bytes}
    broadcast: dict[tuple[str, str], dict[bytes, bytes]] = field(default_factory=dict)
    # other job metadata rows of "$meta" (not descriptors, not list modes), restored verbatim
    meta: dict[bytes, bytes] = field(default_factory=dict)

    @classmethod
    def from_view(cls, view: FrozenView) -> OperatorSnapshot:
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
            elif not primary.startswith(STATE_META):
                snap.meta[primary] = value
        return snap

    def to_bytes(self) -> bytes:
        body = {
            "version": _VERSION,
            "lists": [[op, name, sub, raw] for (op, name, sub), raw in sorted(self.lists.items())],
            "modes": [[op, name, mode] for (op, name), mode in sorted(self.modes.items())],
            "broadcast": [
                [op, name, sorted(entries.items())] for (op, name), entries in sorted(self.broadcast.items())
            ],
            "meta": sorted(self.meta.items()),
        }
        return ZSTD.compress(msgpack.packb(body, use_bin_type=True))

    @classmethod
    def from_bytes(cls, data: bytes) -> OperatorSnapshot:
        try:
            body = msgpack.unpackb(ZSTD.decompress(data), raw=False, strict_map_key=False)
            if body["version"] != _VERSION:
                raise SnapshotCorrupt(f"unsupported operator state version {body['version']!r}")
            return cls(
                {(op, name, check_subtask(sub)): raw for op, name, sub, raw in body["lists"]},
                {(op, name): mode for op, name, mode in body["modes"]},
                {(op, name): dict(entries) for op, name, entries in body["broadcast"]},
                dict(body["meta"]),
            )
        except SnapshotCorrupt:
            raise
        except Exception as exc:
            raise SnapshotCorrupt(f"unreadable operator state: {exc}") from None


def merge_for_replica(
    parts: list[OperatorSnapshot],
    replica_index: int,
    replica_count: int,
    operator_parallelism: dict[str, int] | None = None,
) -> OperatorSnapshot:
    """Operator state for one replica from every part of a snapshot (Flink's ``StateAssignmentOperation``).

    List states of an operator named in ``operator_parallelism`` are redistributed with
    Flink's rules to that many subtasks; others keep their subtasks. The replica keeps the
    subtasks ``s`` with ``s % replica_count == replica_index``. Broadcast state and job
    metadata go to every replica (the first part holding an entry wins).
    """
    operator_parallelism = operator_parallelism or {}
    for operator, parallelism in operator_parallelism.items():
        check_parallelism(parallelism, f"operator_parallelism[{operator!r}]")
    merged = OperatorSnapshot()
    for part in parts:
        for state, mode in part.modes.items():
            merged.modes.setdefault(state, mode)
        for state, entries in part.broadcast.items():
            merged.broadcast.setdefault(state, dict(entries))
        for row, value in part.meta.items():
            merged.meta.setdefault(row, value)
        for subtask_list, raw in part.lists.items():
            merged.lists.setdefault(subtask_list, raw)

    for operator, parallelism in operator_parallelism.items():
        merged.lists = _redistributed(merged, operator, parallelism)

    merged.lists = {k: v for k, v in merged.lists.items() if k[2] % replica_count == replica_index}
    return merged


def _redistributed(snap: OperatorSnapshot, operator: str, parallelism: int) -> dict[tuple[str, str, int], bytes]:
    mine = {k: v for k, v in snap.lists.items() if k[0] == operator}
    if not mine:
        return snap.lists
    old_parallelism = max(sub for _op, _name, sub in mine) + 1
    old = [OperatorSubtaskState() for _ in range(old_parallelism)]
    for (_op, name, sub), raw in sorted(mine.items()):
        mode = snap.modes.get((operator, name), "split")
        old[sub].lists[name] = (mode, list(iter_values(raw)))
    new = redistribute(old, parallelism)
    lists = {k: v for k, v in snap.lists.items() if k[0] != operator}
    for sub, state in enumerate(new):
        for name, (_mode, elements) in state.lists.items():
            if elements:
                lists[(operator, name, sub)] = b"".join(encode_value(e) for e in elements)
    return lists


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
