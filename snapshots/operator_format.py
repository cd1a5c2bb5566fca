"""The operator-state file of a snapshot part: list states with their modes, broadcast maps, job
metadata, as stored bytes.

Flink writes operator state as its own stream (``OperatorStreamStateHandle``); here it is
one small file per replica part: msgpack of the stored bytes, zstd-compressed. Keyed state
descriptors are not in it (they are in the keyed header). Below the backends and in both
distributions: the engine reads a partition into it and restores from it
(``statehouse.backends.snapshot.operator_format``); a reader of a checkpoint without a server
(the Spark data source) reads it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self

import msgpack

from statehouse.protocol.keygroups import UPPER_BOUND_MAX_PARALLELISM
from statehouse.snapshots.compression import ZSTD
from statehouse.snapshots.errors import SnapshotCorrupt

_VERSION = 1


@dataclass
class OperatorStateData:
    """The operator state of one replica part, as stored bytes."""

    # (operator, name, subtask) -> concatenated msgpack elements
    lists: dict[tuple[str, str, int], bytes] = field(default_factory=dict)
    modes: dict[tuple[str, str], str] = field(default_factory=dict)
    # (operator, name) -> {user key bytes: value bytes}
    broadcast: dict[tuple[str, str], dict[bytes, bytes]] = field(default_factory=dict)
    # other job metadata rows of "$meta" (not descriptors, not list modes), restored verbatim
    meta: dict[bytes, bytes] = field(default_factory=dict)

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
    def from_bytes(cls, data: bytes) -> Self:
        try:
            body = msgpack.unpackb(ZSTD.decompress(data), raw=False, strict_map_key=False)
            if body["version"] != _VERSION:
                raise SnapshotCorrupt(f"unsupported operator state version {body['version']!r}")
            return cls(
                {(op, name, _subtask(sub)): raw for op, name, sub, raw in body["lists"]},
                {(op, name): mode for op, name, mode in body["modes"]},
                {(op, name): dict(entries) for op, name, entries in body["broadcast"]},
                dict(body["meta"]),
            )
        except SnapshotCorrupt:
            raise
        except Exception as exc:
            raise SnapshotCorrupt(f"unreadable operator state: {exc}") from None


def _subtask(subtask: Any) -> int:
    """A stored subtask index: below Flink's largest parallelism, as every write's was."""
    if isinstance(subtask, bool) or not isinstance(subtask, int) or not 0 <= subtask < UPPER_BOUND_MAX_PARALLELISM:
        raise SnapshotCorrupt(f"operator state holds subtask index {subtask!r}")
    return subtask


def list_elements(raw: bytes) -> list[Any]:
    """The elements of a stored list (its msgpack records, concatenated)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(raw)
    return list(unpacker)
