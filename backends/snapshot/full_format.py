"""The full (canonical) keyed snapshot format, the same for both backends and savepoints.

A stream is::

    header   b"SHKG" | u16 version | u32 length | JSON (format version, job, max parallelism,
             key-group range, tables, state meta info incl. TTL)       never compressed
    section  per key group of the range, in order:
             u32 key group | u8 codec | codec(payload)
             payload = msgpack records [table id, primary, secondary, value] in table then
                       byte order (table id = index in the header's table list)

The handle records the header's and every section's offset, length and SHA-256 (Flink's
``KeyGroupRangeOffsets``), so a restore of a sub-range reads the header plus one contiguous
byte range and verifies exactly what it read. Stored bytes are backend-independent, so any
backend restores any full snapshot.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from statehouse.backends.base.partition import FrozenView
from statehouse.backends.descriptors import StateDescriptor
from statehouse.backends.keyed import ttl_cleaner
from statehouse.keygroups import KeyGroupRange
from statehouse.snapshots.compression import Codec, codec_by_id
from statehouse.snapshots.errors import SnapshotCorrupt
from statehouse.snapshots.handles import KeyGroupRangeOffsets, KeyGroupSection, KeyGroupsHandle
from statehouse.snapshots.storage.base import CheckpointOutputStream, CheckpointStorage, check_bytes

MAGIC = b"SHKG"
FORMAT_VERSION = 1
_HEAD = struct.Struct(">4sHI")
_SECTION = struct.Struct(">IB")


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

    @property
    def descriptors(self) -> list[StateDescriptor]:
        return [StateDescriptor.from_dict(s) for s in self.states]


def _cleaners(descriptors: list[StateDescriptor]) -> dict[str, Callable[[bytes, int], bytes | None]]:
    """Flink's ``cleanupFullSnapshot``: per TTL state, how to drop expired data while writing."""
    cleaners = {}
    for descriptor in descriptors:
        if descriptor.ttl is not None and descriptor.ttl.cleanup_full_snapshot:
            clean = ttl_cleaner(descriptor)
            if clean is not None:
                cleaners[descriptor.name] = clean
    return cleaners


def write_key_groups(
    view: FrozenView,
    out: CheckpointOutputStream,
    header: SnapshotHeader,
    codec: Codec,
    now_ms: int,
    cancelled: Callable[[], bool] = lambda: False,
) -> KeyGroupsHandle:
    """Write the keyed part of ``view`` for the header's key-group range; returns the handle."""
    head = json.dumps(header.to_dict(), separators=(",", ":")).encode()
    head_block = _HEAD.pack(MAGIC, FORMAT_VERSION, len(head)) + head
    out.write(head_block)
    head_section = KeyGroupSection(0, len(head_block), hashlib.sha256(head_block).hexdigest())
    cleaners = _cleaners(header.descriptors)
    packer = msgpack.Packer(use_bin_type=True)
    sections = []
    for kg in header.key_group_range:
        if cancelled():
            raise InterruptedError("snapshot cancelled")
        records = []
        for table_id, table in enumerate(header.tables):
            clean = cleaners.get(table)
            for primary, secondary, stored in view.scan(table, kg):
                value = clean(stored, now_ms) if clean is not None else stored
                if value is None:
                    continue  # expired: not in the snapshot
                records.append(packer.pack([table_id, primary, secondary, value]))
        section = _SECTION.pack(kg, codec.id) + codec.compress(b"".join(records))
        sections.append(KeyGroupSection(out.tell(), len(section), hashlib.sha256(section).hexdigest()))
        out.write(section)
    stream = out.close_and_get_handle()
    return KeyGroupsHandle(stream, head_section, KeyGroupRangeOffsets(header.key_group_range, tuple(sections)))


def parse_header(block: bytes) -> SnapshotHeader:
    try:
        magic, version, length = _HEAD.unpack_from(block)
        if magic != MAGIC or version != FORMAT_VERSION:
            raise SnapshotCorrupt("not a Statehouse full snapshot (bad magic or version)")
        return SnapshotHeader.from_dict(json.loads(block[_HEAD.size : _HEAD.size + length]))
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
            stored_kg, codec_id = _SECTION.unpack_from(section)
            if stored_kg != kg:
                raise SnapshotCorrupt(f"section of key group {kg} holds key group {stored_kg}")
            try:
                payload = codec_by_id(codec_id).decompress(section[_SECTION.size :])
                unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
                unpacker.feed(payload)
                for table_id, primary, secondary, value in unpacker:
                    yield kg, tables[table_id], primary, secondary, value
            except (KeyError, ValueError, IndexError, msgpack.UnpackException) as exc:
                raise SnapshotCorrupt(f"key group {kg} section is unreadable: {exc}") from None


def fetch_key_groups(storage: CheckpointStorage, handle: KeyGroupsHandle, wanted: KeyGroupRange) -> FetchedKeyGroups:
    """Read and verify the header and the sections of ``wanted`` ∩ the handle's range.

    The whole file is read (and its SHA-256 checked) only when every key group is wanted;
    otherwise the header and one contiguous ranged read cover exactly the needed sections.
    """
    part = handle.offsets.intersection(wanted)
    if part is not None and part.key_group_range == handle.key_group_range:
        data = storage.read_verified(handle.stream)
        header_block = data[: handle.header.length]
        chunks = [
            (kg, data[s.offset : s.offset + s.length])
            for kg, s in zip(part.key_group_range, part.sections, strict=True)
        ]
        return FetchedKeyGroups(parse_header(header_block), chunks)
    header_block = storage.read_range_verified(handle.stream, 0, handle.header.length, handle.header.sha256)
    header = parse_header(header_block)
    if part is None:
        return FetchedKeyGroups(header, [])
    first, last = part.sections[0], part.sections[-1]
    span = storage.read_existing(handle.stream, first.offset, last.offset + last.length - first.offset)
    chunks = []
    for kg, section in zip(part.key_group_range, part.sections, strict=True):
        chunk = span[section.offset - first.offset : section.offset - first.offset + section.length]
        check_bytes(f"{handle.stream.path} key group {kg}", chunk, section.length, section.sha256)
        chunks.append((kg, chunk))
    return FetchedKeyGroups(header, chunks)
