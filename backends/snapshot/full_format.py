"""The full (canonical) keyed snapshot format, write side: a frozen view's key groups as one
stream (the format, and its reading, are in ``statehouse.snapshots.full_format``, which a reader
without a server shares). The same for both backends and savepoints; a heap checkpoint's changelog deltas
(:func:`delta_records`) share the layout.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from itertools import repeat
from typing import Any, Protocol

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


Record = Sequence[Any]
"""``[table id, primary, secondary, stored value]``, or a changelog's reset ``[table id, primary]``
(a list or a tuple: msgpack writes both as an array)."""
Records = Callable[[int, str, int, bool], list[Record]]
"""``(table id, table, key group, reset)`` -> the records of that table's key group; ``reset``:
TTL's cleanup may drop values, so a delta resets every key it names."""


def write_key_groups(
    view: FrozenView,
    out: CheckpointOutputStream,
    header: SnapshotHeader,
    codec: Codec,
    now_ms: int,
    cancelled: Callable[[], bool] = lambda: False,
) -> KeyGroupsHandle:
    """Write the keyed part of ``view`` for the header's key-group range; returns the handle."""

    def records(table_id: int, table: str, kg: int, reset: bool) -> list[Record]:
        return _scanned(view, table_id, table, kg)

    return write_sections(out, header, codec, now_ms, cancelled, records)


def _scanned(view: FrozenView | ChangedKeys, table_id: int, table: str, kg: int) -> list[Record]:
    """A key group's records of a table, whole, as a base holds them (tuples made in a C loop)."""
    return list(map(operator.add, repeat((table_id,)), view.scan(table, kg)))


class ChangedKeys(Protocol):
    """A frozen view's current content of the keys a changelog delta holds."""

    def scan(self, table: str, key_group: int) -> Iterable[tuple[bytes, bytes, bytes]]:
        """A key group's ``(primary, secondary, value)`` records of a table, in byte order."""

    def values(self, table: str, key_group: int, primaries: Sequence[bytes]) -> list[bytes | None]:
        """A flat table's value of each primary (``None``: it has none)."""

    def entries(self, table: str, key_group: int, primary: bytes) -> Iterable[tuple[bytes, bytes]]:
        """A nested table's ``(secondary, value)`` entries of one primary, in byte order."""


def delta_records(
    view: ChangedKeys,
    changed: Mapping[str, Mapping[int, Mapping[bytes, bytes | None]]],
    header: SnapshotHeader,
    whole: Set[int] = frozenset(),
    unread: Mapping[str, Set[int]] | None = None,
) -> Records:
    """The records of a changelog delta (:mod:`statehouse.snapshots.changelog`) for
    :func:`write_sections`: per table and key group, each changed primary in byte order with its
    entries, and a reset record ``[table id, primary]`` first where it has none (or may have none
    once TTL's cleanup drops its expired entries). A flat table's value is the one ``changed``
    gives (``None``: none), but in the key groups ``unread`` names per table, whose values
    ``view`` holds; a nested table's entries are ``view``'s. The key groups of ``whole`` are
    written whole instead, as a base writes them: a chain begins there."""
    unread = unread or {}

    def records(table_id: int, table: str, kg: int, reset: bool) -> list[Record]:
        if kg in whole:
            return _scanned(view, table_id, table, kg)
        group = changed.get(table, {}).get(kg)
        if not group:
            return []
        primaries = sorted(group)
        if not header.tables[table]:
            if kg in unread.get(table, ()):
                values = view.values(table, kg, primaries)
            else:
                values = list(map(group.__getitem__, primaries))
            if reset:
                return [r for p, v in zip(primaries, values, strict=True) for r in _reset_and_value(table_id, p, v)]
            pairs = zip(primaries, values, strict=True)
            return [[table_id, p, b"", v] if v is not None else [table_id, p] for p, v in pairs]
        found: list[Record] = []
        for primary in primaries:
            entries = [[table_id, primary, s, v] for s, v in view.entries(table, kg, primary)]
            if reset or not entries:
                found.append([table_id, primary])
            found.extend(entries)
        return found

    return records


def _cleaned(found: list[Record], clean: Callable[[bytes, int], bytes | None], now_ms: int) -> list[Record]:
    """``found`` with TTL's full-snapshot cleanup applied to each value; expired ones left out."""
    kept: list[Record] = []
    for record in found:
        if len(record) == 4:
            value = clean(record[3], now_ms)
            if value is None:
                continue  # expired: not in the snapshot
            record = (*record[:3], value)
        kept.append(record)
    return kept


def _packed_one_after_another(packer: msgpack.Packer, records: list[Record]) -> bytes:
    """Each record's msgpack, one after the other: the array of them packed in one call, less the
    array's header (an array's items are its elements' packings back to back)."""
    return packer.pack(records)[len(packer.pack_array_header(len(records))) :]


def _reset_and_value(table_id: int, primary: bytes, value: bytes | None) -> list[list[Any]]:
    return [[table_id, primary]] if value is None else [[table_id, primary], [table_id, primary, b"", value]]


def write_sections(
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
    packer = msgpack.Packer(use_bin_type=True)
    sections = []
    for kg in header.key_group_range:
        if cancelled():
            raise InterruptedError("snapshot cancelled")
        packed: list[bytes] = []
        for table_id, table in enumerate(header.tables):
            clean = cleaners.get(table)
            found = records(table_id, table, kg, clean is not None)
            if clean is not None:
                found = _cleaned(found, clean, now_ms)
            if found:
                packed.append(_packed_one_after_another(packer, found))
        section = SECTION.pack(kg, codec.id) + codec.compress(b"".join(packed))
        sections.append(KeyGroupSection(out.tell(), len(section), hashlib.sha256(section).hexdigest()))
        out.write(section)
    stream = out.close_and_get_handle()
    return KeyGroupsHandle(stream, head_section, KeyGroupRangeOffsets(header.key_group_range, tuple(sections)))
