"""The full (canonical) keyed snapshot format, write side: a frozen view's key groups as one
stream (the format, and its reading, are in ``statehouse.snapshots.full_format``, which a reader
without a server shares). The same for both backends and savepoints.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

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
        records = []
        for table_id, table in enumerate(header.tables):
            clean = cleaners.get(table)
            for primary, secondary, stored in view.scan(table, kg):
                value = clean(stored, now_ms) if clean is not None else stored
                if value is None:
                    continue  # expired: not in the snapshot
                records.append(packer.pack([table_id, primary, secondary, value]))
        section = SECTION.pack(kg, codec.id) + codec.compress(b"".join(records))
        sections.append(KeyGroupSection(out.tell(), len(section), hashlib.sha256(section).hexdigest()))
        out.write(section)
    stream = out.close_and_get_handle()
    return KeyGroupsHandle(stream, head_section, KeyGroupRangeOffsets(header.key_group_range, tuple(sections)))
