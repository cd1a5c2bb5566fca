"""Dropping expired data from stored records: full snapshots and incremental TTL cleanup."""

from __future__ import annotations

from collections.abc import Callable

from statehouse.snapshots.stored.codec import encode_timestamped, encode_value, iter_timestamped, split_timestamped
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.ttl import is_expired


def ttl_cleaner(descriptor: StateDescriptor) -> Callable[[bytes, int], bytes | None] | None:
    """How to drop expired data from one stored record, or ``None`` without TTL.

    Used by full snapshots (Flink's ``cleanupFullSnapshot``) and by incremental cleanup.
    Returns the record unchanged, a shorter list, or ``None`` when nothing is left.
    """
    ttl = descriptor.ttl
    if ttl is None:
        return None
    ttl_ms = ttl.ttl_ms
    if descriptor.kind != "list":

        def clean_record(raw: bytes, now: int) -> bytes | None:
            return None if is_expired(split_timestamped(raw)[0], ttl_ms, now) else raw

        return clean_record

    def clean_list(raw: bytes, now: int) -> bytes | None:
        stored = list(iter_timestamped(raw))
        kept = [(ts, v) for ts, v in stored if not is_expired(ts, ttl_ms, now)]
        if len(kept) == len(stored):
            return raw
        return b"".join(encode_timestamped(ts, encode_value(v)) for ts, v in kept) or None

    return clean_list
