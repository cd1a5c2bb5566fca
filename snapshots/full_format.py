"""The full (canonical) keyed snapshot format, read side: the header, the sections of some key
groups (a ranged read of just those), their records. Below the backends and in both
distributions: the server's restore reads through it, and so does a reader of a checkpoint that
has no server (the Spark data source). The writer is the engine's
(``statehouse.backends.snapshot.full_format``).

A stream is::

    header   b"SHKG" | u16 version | u32 length | JSON (format version, job, max parallelism,
             key-group range, tables, state meta info incl. TTL)       never compressed
    section  per key group of the range, in order:
             u32 key group | u8 codec | codec(payload)
             payload = msgpack records [table id, primary, secondary, value] in table then
                       byte order (table id = index in the header's table list)

The handle records the header's and every section's offset, length and SHA-256 (Flink's
``KeyGroupRangeOffsets``), so a restore of a sub-range reads the header and one contiguous
byte range (one read when they are close) and verifies exactly what it read. Stored bytes are
backend-independent, so any backend restores any full snapshot.
"""

from __future__ import annotations

import bisect
import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.compression import codec_by_id
from statehouse.snapshots.errors import SnapshotCorrupt
from statehouse.snapshots.handles import KeyGroupRangeOffsets, KeyGroupsHandle
from statehouse.snapshots.storage.base import CheckpointStorage, check_bytes
from statehouse.snapshots.stored.record_columns import bulk_decoding

MAGIC = b"SHKG"
FORMAT_VERSION = 1
HEAD = struct.Struct(">4sHI")
SECTION = struct.Struct(">IB")


@dataclass(frozen=True, slots=True)
class SnapshotHeader:
    """State meta info of a keyed snapshot (Flink's ``KeyedBackendSerializationProxy``)."""

    job: str
    max_parallelism: int
    key_group_range: KeyGroupRange
    tables: dict[str, bool]  # name -> nested, in table-id order
    states: list[dict[str, Any]]  # descriptor dicts, TTL included

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "job": self.job,
            "max_parallelism": self.max_parallelism,
            "key_group_range": self.key_group_range.as_list(),
            "tables": [[name, nested] for name, nested in self.tables.items()],
            "states": self.states,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SnapshotHeader:
        if data.get("format_version") != FORMAT_VERSION:
            raise SnapshotCorrupt(f"unsupported snapshot format version {data.get('format_version')!r}")
        start, end = data["key_group_range"]
        return cls(
            data["job"],
            int(data["max_parallelism"]),
            KeyGroupRange(start, end),
            {name: bool(nested) for name, nested in data["tables"]},
            list(data["states"]),
        )


def parse_header(block: bytes) -> SnapshotHeader:
    try:
        magic, version, length = HEAD.unpack_from(block)
        if magic != MAGIC or version != FORMAT_VERSION:
            raise SnapshotCorrupt("not a Statehouse full snapshot (bad magic or version)")
        return SnapshotHeader.from_dict(json.loads(block[HEAD.size : HEAD.size + length]))
    except (struct.error, ValueError, KeyError, TypeError) as exc:
        raise SnapshotCorrupt(f"unreadable snapshot header: {exc}") from None


@dataclass(frozen=True, slots=True)
class FetchedKeyGroups:
    """The verified, still compressed bytes of some key groups of one full snapshot."""

    header: SnapshotHeader
    sections: list[tuple[int, bytes]]  # (key group, section bytes)

    def records(self) -> Iterator[tuple[int, str, bytes, bytes, bytes]]:
        """``(key group, table, primary, secondary, value)`` in section order."""
        tables = list(self.header.tables)
        for kg, section in self.sections:
            try:
                for table_id, primary, secondary, value in self._section(kg, section):
                    yield kg, tables[table_id], primary, secondary, value
            except (TypeError, ValueError, IndexError) as exc:
                raise SnapshotCorrupt(f"key group {kg} section is unreadable: {exc}") from None

    def section_tuples(self) -> Iterator[tuple[int, list[tuple[int, bytes, bytes, bytes]]]]:
        """Each key group's ``(table id, primary, secondary, value)`` records, a list per section
        in section order (ids index ``header.tables``): what a bulk load takes a section at a time."""
        for kg, section in self.sections:
            with bulk_decoding():
                yield kg, self._section(kg, section, use_list=False)

    def table_records(
        self, table: str
    ) -> Iterator[tuple[list[int], Sequence[bytes], Sequence[bytes], Sequence[bytes]]]:
        """``table``'s records section by section, as columns: key groups, primaries,
        secondaries, values (what a reader builds a table from without a step per record)."""
        table_id = list(self.header.tables).index(table) if table in self.header.tables else None
        if table_id is None:
            return
        for kg, section in self.sections:
            with bulk_decoding():
                stored = self._section(kg, section, use_list=False)
                if not stored:
                    continue
                try:
                    ids, primaries, secondaries, values = zip(*stored, strict=True)
                except (TypeError, ValueError) as exc:
                    raise SnapshotCorrupt(f"key group {kg} section is unreadable: {exc}") from None
            columns: list[Sequence[bytes]] = [primaries, secondaries, values]
            if ids.count(table_id) != len(ids):
                kept = [i for i, found in enumerate(ids) if found == table_id]
                columns = [[column[i] for i in kept] for column in columns]
            primaries_kept, secondaries_kept, values_kept = columns
            if primaries_kept:
                yield [kg] * len(primaries_kept), primaries_kept, secondaries_kept, values_kept

    def _section(self, kg: int, section: bytes, use_list: bool = True) -> list[Any]:
        stored_kg, codec_id = SECTION.unpack_from(section)
        if stored_kg != kg:
            raise SnapshotCorrupt(f"section of key group {kg} holds key group {stored_kg}")
        try:
            payload = codec_by_id(codec_id).decompress(section[SECTION.size :])
            unpacker = msgpack.Unpacker(
                raw=False, strict_map_key=False, use_list=use_list, max_buffer_size=max(len(payload), 1)
            )
            unpacker.feed(payload)
            return list(unpacker)
        except (KeyError, ValueError, IndexError, msgpack.UnpackException) as exc:
            raise SnapshotCorrupt(f"key group {kg} section is unreadable: {exc}") from None


def fetch_key_groups(storage: CheckpointStorage, handle: KeyGroupsHandle, wanted: KeyGroupRange) -> FetchedKeyGroups:
    """Read and verify the header and the sections of ``wanted`` ∩ the handle's range."""
    return fetch_restrictions(storage, [handle], wanted)[0]


def _section_regions(path: str, part: KeyGroupRangeOffsets) -> list[tuple[int, int, str, str]]:
    return [
        (s.offset, s.length, s.sha256, f"{path} key group {kg}")
        for kg, s in zip(part.key_group_range, part.sections, strict=True)
    ]


def fetch_restrictions(
    storage: CheckpointStorage, handles: Sequence[KeyGroupsHandle], wanted: KeyGroupRange
) -> list[FetchedKeyGroups]:
    """:func:`fetch_key_groups` for each of ``handles``: restrictions of one stream (one header)
    to key groups of their own, as the chains of a changelog name a shared file, read together.

    The header and the wanted sections are regions of the file read in as few ranged reads as
    waste at most half of what they fetch: a gap between two regions is read with them when it
    is no larger than what the read holds before it (a request costs more than a few bytes). A
    read that spans the whole file is checked against the file's SHA-256; otherwise the header
    and each section against their own.
    """
    stream, header_block = handles[0].stream, handles[0].header
    if any(h.stream != stream or h.header != header_block for h in handles):
        raise ValueError("restrictions of different streams or headers")
    parts = [h.offsets.intersection(wanted) for h in handles]
    # (offset, length, sha256, what) of the header, then of each wanted section, by part
    header_region = (header_block.offset, header_block.length, header_block.sha256, stream.path)
    wanted_regions = [_section_regions(stream.path, p) if p is not None else [] for p in parts]
    spans: list[list[int]] = []  # [start, end] of each read, in file order
    for start, length, _sha, _what in sorted([header_region, *(r for rs in wanted_regions for r in rs)]):
        if spans and start - spans[-1][1] <= spans[-1][1] - spans[-1][0]:
            spans[-1][1] = max(spans[-1][1], start + length)
        else:
            spans.append([start, start + length])
    whole = spans == [[0, stream.size]]
    if whole:
        reads = [(0, storage.read_verified(stream))]
    else:
        reads = [(start, storage.read_existing(stream, start, end - start)) for start, end in spans]
    starts = [start for start, _data in reads]

    def region(offset: int, length: int, sha256: str, what: str) -> bytes:
        start, data = reads[bisect.bisect_right(starts, offset) - 1]
        chunk = data[offset - start : offset - start + length]
        if not whole:  # else the file's own checksum covered it
            check_bytes(what, chunk, length, sha256)
        return chunk

    header = parse_header(region(*header_region))
    return [
        FetchedKeyGroups(header, [(kg, region(*r)) for kg, r in zip(p.key_group_range, rs, strict=True)] if p else [])
        for p, rs in zip(parts, wanted_regions, strict=True)
    ]
