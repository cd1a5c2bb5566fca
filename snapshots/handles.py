"""State handles: small serializable values saying where snapshot bytes are.

Flink's roles: :class:`StreamHandle` is a ``StreamStateHandle`` (one file, its size and
checksum), :class:`KeyGroupsHandle` a ``KeyGroupsStateHandle`` (a stream plus
``KeyGroupRangeOffsets``), :class:`IncrementalHandle` an ``IncrementalRemoteKeyedStateHandle``
(RocksDB files, the SSTs shared between checkpoints), :class:`ChangelogHandle` a heap checkpoint
as a base and the deltas since (Flink's ``ChangelogStateBackendHandle``). Paths inside a handle are relative
to the snapshot directory that holds the ``_metadata`` (shared files are ``../shared/...``),
so a savepoint directory can be moved as a whole.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field, replace
from typing import Any

from statehouse.protocol.keygroups import KeyGroupRange


@dataclass(frozen=True, slots=True)
class StreamHandle:
    """One durable file: its path, size in bytes and SHA-256 (hex)."""

    path: str
    size: int
    sha256: str

    def relative_to(self, base: str) -> StreamHandle:
        return replace(self, path=posixpath.relpath(self.path, base or "."))

    def under(self, base: str) -> StreamHandle:
        return replace(self, path=posixpath.normpath(posixpath.join(base, self.path)))

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StreamHandle:
        return cls(_stored_path(data["path"]), int(data["size"]), data["sha256"])


def _stored_path(path: Any) -> str:
    """A path read from snapshot metadata names a file of the snapshot directory or of the job's
    shared directory beside it (``../shared/<file>``), nothing else: the metadata is input, and a
    restore from an allowed location must not read files outside it."""
    if not isinstance(path, str) or posixpath.isabs(path) or "\0" in path or posixpath.normpath(path) != path:
        raise ValueError(f"snapshot file path {path!r} is not a normalized relative path")
    parts = path.split("/")
    if ".." in parts and not (len(parts) == 3 and parts[:2] == ["..", "shared"]):
        raise ValueError(f"snapshot file path {path!r} leaves the snapshot (only ../shared/<file> may)")
    return path


@dataclass(frozen=True, slots=True)
class KeyGroupSection:
    """Where one key group's section is in a full-snapshot stream (and its checksum)."""

    offset: int
    length: int
    sha256: str


@dataclass(frozen=True, slots=True)
class KeyGroupRangeOffsets:
    """Flink's ``KeyGroupRangeOffsets``: the section of every key group of a range."""

    key_group_range: KeyGroupRange
    sections: tuple[KeyGroupSection, ...]

    def __post_init__(self) -> None:
        if len(self.sections) != len(self.key_group_range):
            raise ValueError("one section per key group of the range")

    def section(self, key_group: int) -> KeyGroupSection:
        return self.sections[key_group - self.key_group_range.start]

    def intersection(self, other: KeyGroupRange) -> KeyGroupRangeOffsets | None:
        common = self.key_group_range.intersection(other)
        if not len(common):
            return None
        first = common.start - self.key_group_range.start
        return KeyGroupRangeOffsets(common, self.sections[first : first + len(common)])

    def to_dict(self) -> dict[str, Any]:
        # Columns rather than objects: with 32768 key groups this stays compact.
        return {
            "key_group_range": self.key_group_range.as_list(),
            "offsets": [s.offset for s in self.sections],
            "lengths": [s.length for s in self.sections],
            "sha256": [s.sha256 for s in self.sections],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KeyGroupRangeOffsets:
        start, end = data["key_group_range"]
        sections = tuple(
            KeyGroupSection(o, n, h) for o, n, h in zip(data["offsets"], data["lengths"], data["sha256"], strict=True)
        )
        return cls(KeyGroupRange(start, end), sections)


@dataclass(frozen=True, slots=True)
class KeyGroupsHandle:
    """A full (canonical) keyed snapshot: one stream, a header, one section per key group."""

    stream: StreamHandle
    header: KeyGroupSection  # the header block at the start of the stream
    offsets: KeyGroupRangeOffsets

    @property
    def key_group_range(self) -> KeyGroupRange:
        return self.offsets.key_group_range

    def under(self, base: str) -> KeyGroupsHandle:
        """The handle with its stream's path joined to ``base``."""
        return replace(self, stream=self.stream.under(base))

    def relative_to(self, base: str) -> KeyGroupsHandle:
        """The handle with its stream's path made relative to ``base``."""
        return replace(self, stream=self.stream.relative_to(base))

    def restricted(self, key_groups: KeyGroupRange) -> KeyGroupsHandle | None:
        """The same stream's sections of the key groups of ``key_groups`` it has (None: none)."""
        offsets = self.offsets.intersection(key_groups)
        return None if offsets is None else replace(self, offsets=offsets)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "key_groups",
            "stream": self.stream.to_dict(),
            "header": [self.header.offset, self.header.length, self.header.sha256],
            "offsets": self.offsets.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KeyGroupsHandle:
        return cls(
            StreamHandle.from_dict(data["stream"]),
            KeyGroupSection(*data["header"]),
            KeyGroupRangeOffsets.from_dict(data["offsets"]),
        )


@dataclass(frozen=True, slots=True)
class IncrementalHandle:
    """An incremental RocksDB checkpoint: SST files shared by reference, the rest private.

    ``shared`` and ``private`` map the file's local RocksDB name to its handle;
    ``backend_uid`` is the RocksDB identity of the database the files came from, so local
    SST names are only reused against checkpoints of the same database. ``spans``: for a table
    file of a keyed table, ``(table, first key group, last key group)`` its keys (and range
    deletions) lie within, as the checkpoint's own MANIFEST says; a read of some key groups
    needs only the files whose span overlaps them (:meth:`files_for`). A file without one (the
    job's metadata, a handle written before spans were recorded) is always read.
    """

    backend_uid: str
    key_group_range: KeyGroupRange
    checkpoint_id: int
    shared: dict[str, StreamHandle] = field(default_factory=dict)
    private: dict[str, StreamHandle] = field(default_factory=dict)
    tables: dict[str, bool] = field(default_factory=dict)
    spans: dict[str, tuple[str, int, int]] = field(default_factory=dict)

    def files_for(self, wanted: KeyGroupRange) -> dict[str, StreamHandle]:
        """The files a read of the ``wanted`` key groups needs: every private file (MANIFEST,
        CURRENT, logs), every shared file without a span (OPTIONS; a table file not understood),
        and the table files whose span overlaps."""
        files = dict(self.private)
        for name, handle in self.shared.items():
            span = self.spans.get(name)
            if span is None or (span[1] <= wanted.end and span[2] >= wanted.start):
                files[name] = handle
        return files

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "incremental",
            "backend_uid": self.backend_uid,
            "key_group_range": self.key_group_range.as_list(),
            "checkpoint_id": self.checkpoint_id,
            "shared": {n: h.to_dict() for n, h in sorted(self.shared.items())},
            "private": {n: h.to_dict() for n, h in sorted(self.private.items())},
            "tables": self.tables,
            "spans": {n: list(span) for n, span in sorted(self.spans.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IncrementalHandle:
        start, end = data["key_group_range"]
        return cls(
            data["backend_uid"],
            KeyGroupRange(start, end),
            int(data["checkpoint_id"]),
            {n: StreamHandle.from_dict(h) for n, h in data["shared"].items()},
            {n: StreamHandle.from_dict(h) for n, h in data["private"].items()},
            dict(data["tables"]),
            {n: (str(t), int(first), int(last)) for n, (t, first, last) in data.get("spans", {}).items()},
        )


@dataclass(frozen=True, slots=True)
class ChangelogChain:
    """Some key groups of a heap checkpoint: a full ``base`` of an earlier checkpoint, then
    ``deltas`` in order, each holding the keys that changed since the checkpoint before it with
    their whole content then. Every stream is a shared file (``../shared/...``), reused by the
    checkpoints after it until the next base, and restricted to the chain's key groups (a file
    may hold more: a chain of a layout before a live rescale keeps the key groups that stayed)."""

    base: KeyGroupsHandle
    deltas: tuple[KeyGroupsHandle, ...] = ()

    def __post_init__(self) -> None:
        if any(d.key_group_range != self.base.key_group_range for d in self.deltas):
            raise ValueError("every delta of a changelog chain covers its base's key groups")

    @property
    def key_group_range(self) -> KeyGroupRange:
        return self.base.key_group_range

    def streams(self) -> list[KeyGroupsHandle]:
        """The base, then the deltas in the order they apply."""
        return [self.base, *self.deltas]

    def restricted(self, key_groups: KeyGroupRange) -> ChangelogChain | None:
        """The chain for the key groups of ``key_groups`` it holds (None: it holds none)."""
        streams = [h.restricted(key_groups) for h in self.streams()]
        if streams[0] is None:
            return None
        return ChangelogChain(streams[0], tuple(h for h in streams[1:] if h is not None))

    def bytes(self) -> tuple[int, int]:
        """The bytes a read of the whole chain fetches from the base (its header and its key
        groups' sections), and from the deltas together: a stream's size when not restricted."""
        base, *deltas = (h.header.length + sum(s.length for s in h.offsets.sections) for h in self.streams())
        return base, sum(deltas)

    def under(self, base: str) -> ChangelogChain:
        return ChangelogChain(self.base.under(base), tuple(h.under(base) for h in self.deltas))

    def relative_to(self, base: str) -> ChangelogChain:
        return ChangelogChain(self.base.relative_to(base), tuple(h.relative_to(base) for h in self.deltas))

    def to_dict(self) -> dict[str, Any]:
        return {"base": self.base.to_dict(), "deltas": [d.to_dict() for d in self.deltas]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChangelogChain:
        return cls(KeyGroupsHandle.from_dict(data["base"]), tuple(KeyGroupsHandle.from_dict(d) for d in data["deltas"]))


@dataclass(frozen=True, slots=True)
class ChangelogHandle:
    """A heap checkpoint as a changelog (Flink's changelog state backend, materialized): one
    :class:`ChangelogChain` per run of its key groups, in key-group order, together covering its
    range. One chain, unless a live rescale changed the range: then the key groups the replica
    held before keep their chain, and the ones it took begin a chain of their own."""

    chains: tuple[ChangelogChain, ...]

    def __post_init__(self) -> None:
        if not self.chains:
            raise ValueError("a changelog has at least one chain")
        for before, after in zip(self.chains, self.chains[1:], strict=False):
            if after.key_group_range.start != before.key_group_range.end + 1:
                raise ValueError("a changelog's chains cover adjacent key groups, in order")

    @classmethod
    def of(cls, base: KeyGroupsHandle, deltas: tuple[KeyGroupsHandle, ...] = ()) -> ChangelogHandle:
        """A changelog of one chain."""
        return cls((ChangelogChain(base, deltas),))

    @property
    def key_group_range(self) -> KeyGroupRange:
        return KeyGroupRange(self.chains[0].key_group_range.start, self.chains[-1].key_group_range.end)

    @property
    def base(self) -> KeyGroupsHandle:
        """The base of a changelog of one chain."""
        (chain,) = self.chains
        return chain.base

    @property
    def deltas(self) -> tuple[KeyGroupsHandle, ...]:
        """The deltas of a changelog of one chain."""
        (chain,) = self.chains
        return chain.deltas

    def streams(self) -> list[KeyGroupsHandle]:
        """Every chain's streams, chain after chain (a file in two chains is named twice)."""
        return [h for chain in self.chains for h in chain.streams()]

    def chain_of(self, key_group: int) -> ChangelogChain:
        return next(c for c in self.chains if key_group in c.key_group_range)

    def under(self, base: str) -> ChangelogHandle:
        """The handle with every stream's path joined to ``base``."""
        return ChangelogHandle(tuple(c.under(base) for c in self.chains))

    def relative_to(self, base: str) -> ChangelogHandle:
        """The handle with every stream's path made relative to ``base``."""
        return ChangelogHandle(tuple(c.relative_to(base) for c in self.chains))

    def to_dict(self) -> dict[str, Any]:
        if len(self.chains) == 1:  # the form before chains, which every reader reads
            return {"type": "changelog", **self.chains[0].to_dict()}
        return {"type": "changelog", "chains": [c.to_dict() for c in self.chains]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChangelogHandle:
        if "chains" in data:
            return cls(tuple(ChangelogChain.from_dict(c) for c in data["chains"]))
        return cls((ChangelogChain.from_dict(data),))


KeyedHandle = KeyGroupsHandle | IncrementalHandle | ChangelogHandle


def keyed_handle_from_dict(data: dict[str, Any]) -> KeyedHandle:
    if data["type"] == "key_groups":
        return KeyGroupsHandle.from_dict(data)
    if data["type"] == "incremental":
        return IncrementalHandle.from_dict(data)
    if data["type"] == "changelog":
        return ChangelogHandle.from_dict(data)
    raise ValueError(f"unknown keyed handle type {data['type']!r}")
