"""The full (canonical) keyed snapshot format, write side: a frozen view's key groups as one
stream (the format, and its reading, are in ``statehouse.snapshots.full_format``, which a reader
without a server shares). The same for both backends and savepoints; a heap checkpoint's changelog deltas
(:func:`write_delta`) share the layout.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import msgpack

from statehouse.backends.base.partition import FrozenView
from statehouse.backends.keyed import ttl_cleaner
from statehouse.snapshots.compression import Codec
from statehouse.snapshots.full_format import FORMAT_VERSION, HEAD, MAGIC, SECTION, SnapshotHeader
from statehouse.snapshots.handles import KeyGroupRangeOffsets, KeyGroupSection, KeyGroupsHandle
from statehouse.snapshots.storage.base import CheckpointOutputStream
from statehouse.snapshots.stored.descriptors import StateDescriptor


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
    return _write_sections(out, header, codec, now_ms, cancelled, lambda table, kg: view.scan(table, kg))


KeyEntries = Callable[[str, int, bytes], Iterable[tuple[bytes, bytes]]]
"""``(table, key group, primary)`` -> the key's ``(secondary, value)`` entries as frozen."""


def write_delta(
    entries: KeyEntries,
    changed: Mapping[str, Mapping[int, Sequence[bytes]]],
    out: CheckpointOutputStream,
    header: SnapshotHeader,
    codec: Codec,
    now_ms: int,
    cancelled: Callable[[], bool] = lambda: False,
) -> KeyGroupsHandle:
    """Write a changelog delta (:mod:`statehouse.snapshots.changelog`): for each changed key,
    per table and key group its primaries in byte order, a reset record and its entries as
    ``entries`` reads them (none: deleted)."""

    def records(table: str, kg: int) -> Iterator[tuple[bytes, bytes | None, bytes | None]]:
        for primary in changed.get(table, {}).get(kg, ()):
            yield primary, None, None
            for secondary, stored in entries(table, kg, primary):
                yield primary, secondary, stored

    return _write_sections(out, header, codec, now_ms, cancelled, records)


Records = Callable[[str, int], Iterable[tuple[bytes, Any, Any]]]
"""``(table, key group)`` -> ``(primary, secondary, stored value)`` in order; a ``None``
secondary is a changelog's reset record of the primary."""


def _write_sections(
    out: CheckpointOutputStream,
    header: SnapshotHeader,
    codec: Codec,
    now_ms: int,
    cancelled: Callable[[], bool],
    records: Records,
) -> KeyGroupsHandle:
    """The header, then one section per key group of what ``records`` gives, TTL's
    full-snapshot cleanup dropping expired values."""
    head = json.dumps(header.to_dict(), separators=(",", ":")).encode()
    head_block = HEAD.pack(MAGIC, FORMAT_VERSION, len(head)) + head
    out.write(head_block)
    head_section = KeyGroupSection(0, len(head_block), hashlib.sha256(head_block).hexdigest())
    cleaners = _cleaners([StateDescriptor.from_dict(d) for d in header.states])
    pack = msgpack.Packer(use_bin_type=True).pack
    sections = []
    for kg in header.key_group_range:
        if cancelled():
            raise InterruptedError("snapshot cancelled")
        packed = []
        for table_id, table in enumerate(header.tables):
            clean = cleaners.get(table)
            for primary, secondary, stored in records(table, kg):
                if secondary is None:
                    packed.append(pack([table_id, primary]))
                    continue
                value = clean(stored, now_ms) if clean is not None else stored
                if value is None:
                    continue  # expired: not in the snapshot
                packed.append(pack([table_id, primary, secondary, value]))
        section = SECTION.pack(kg, codec.id) + codec.compress(b"".join(packed))
        sections.append(KeyGroupSection(out.tell(), len(section), hashlib.sha256(section).hexdigest()))
        out.write(section)
    stream = out.close_and_get_handle()
    return KeyGroupsHandle(stream, head_section, KeyGroupRangeOffsets(header.key_group_range, tuple(sections)))
