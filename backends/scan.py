"""A keyed state read as a table: every (key, namespace[, user key]) of a key-group range, in
pages bounded by rows and stored bytes (what Spark's data source reads, ``client/datasource``).

Rows come in (key group, stored key) order; a page ends after ``max_rows`` rows or once the
stored bytes it read reach ``max_bytes`` (a single record larger than that is a page of its
own), and hands back the position of its last row: the next page seeks past it, so a page
costs what it returns, never the state's size. Reads apply Flink's TTL visibility without
writing (a scan neither expires nor refreshes what it reads, as a savepoint reader would not).

Columns: ``key`` (the key type's Arrow type), ``ns``, ``user_key`` (map states: one row per
entry), ``value``, ``key_group`` (int32) and, for TTL states, ``expires_at`` (int64 ms; a list
state's, one per element). ``value`` has the descriptor's Arrow type (``columns.value_type``);
an untyped state's values are JSON text, since their Arrow type could differ from page to page.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import orjson
import pyarrow as pa

from statehouse.backends.codec import (
    decode_primary,
    decode_user_key,
    decode_value,
    iter_timestamped,
    iter_values,
    split_timestamped,
)
from statehouse.backends.columns import to_arrow, value_type
from statehouse.backends.descriptors import StateDescriptor
from statehouse.backends.errors import InvalidArgument
from statehouse.backends.job import Job
from statehouse.backends.ttl import expiration_timestamp, is_expired
from statehouse.keygroups import KeyGroupRange

KEY_TYPES: dict[str, pa.DataType] = {"string": pa.string(), "int": pa.int32(), "long": pa.int64()}
_POSITION = struct.Struct(">HI")  # key group, primary length; then the primary and the secondary
_CHUNK = 512  # flat tables: primaries read per get_many


@dataclass(frozen=True, slots=True)
class Position:
    """Where a page ended: the stored key of its last row."""

    key_group: int
    primary: bytes
    secondary: bytes = b""

    def encode(self) -> bytes:
        return _POSITION.pack(self.key_group, len(self.primary)) + self.primary + self.secondary

    @classmethod
    def decode(cls, data: bytes) -> Position:
        """A position from a cursor's bytes (``InvalidArgument`` if they are not one)."""
        try:
            key_group, length = _POSITION.unpack_from(data)
        except struct.error:
            raise InvalidArgument("cursor is not valid: pass back a next_cursor unchanged") from None
        end = _POSITION.size + length
        if len(data) < end:
            raise InvalidArgument("cursor is not valid: pass back a next_cursor unchanged")
        return cls(key_group, data[_POSITION.size : end], data[end:])


@dataclass(frozen=True, slots=True)
class ScanPage:
    table: pa.Table
    next: Position | None  # None: the range is read to its end
    stored_bytes: int  # what the page read from storage


def schema(descriptor: StateDescriptor) -> pa.Schema:
    """The columns every page of this state has (also an empty one)."""
    fields = [pa.field("key", KEY_TYPES[descriptor.key_type]), pa.field("ns", pa.string())]
    if descriptor.kind == "map":
        fields.append(pa.field("user_key", pa.string()))
    fields += [pa.field("value", _value_type(descriptor)), pa.field("key_group", pa.int32())]
    if descriptor.ttl is not None:
        expiry = pa.list_(pa.int64()) if descriptor.kind == "list" else pa.int64()
        fields.append(pa.field("expires_at", expiry))
    return pa.schema(fields)


def _value_type(descriptor: StateDescriptor) -> pa.DataType:
    typed = value_type(descriptor, "map_get" if descriptor.kind == "map" else "get")
    return typed if typed is not None else pa.string()


def scan(
    job: Job,
    state: str,
    key_groups: KeyGroupRange,
    *,
    after: Position | None = None,
    keys: Sequence[str | int] | None = None,
    max_rows: int,
    max_bytes: int,
) -> ScanPage:
    """One page of ``state``'s rows in ``key_groups`` (owned here: ``KeySpace.owned_part``), after
    ``after``; with ``keys``, only those keys' rows (every namespace): point reads."""
    descriptor = job.descriptor(state)
    reader = _Reader(job, descriptor)
    with job.exclusive():  # the seeking iterators read the live partition: no write in between
        stored = reader.range(key_groups, after) if keys is None else reader.keys(key_groups, keys, after)
        return reader.page(stored, max_rows, max_bytes)


Stored = tuple[int, bytes, bytes, bytes]  # key group, primary, secondary, record


@dataclass(frozen=True, slots=True)
class GroupSize:
    key_group: int
    entries: int  # stored rows (a map's entries), expired ones not yet cleaned up included
    bytes: int  # their stored keys and records


def sizes(job: Job, state: str, key_groups: KeyGroupRange) -> list[GroupSize]:
    """What ``state`` stores per key group of ``key_groups`` (owned here: ``KeySpace.owned_part``;
    groups holding nothing left out). One key group at a time under the job's lock, so writes
    wait for one group's count, never the whole state's."""
    job.descriptor(state)  # state_not_found first
    found = []
    for kg in key_groups:
        with job.exclusive():
            entries = stored = 0
            for primary, secondary, record in job.partition.scan(state, kg):
                entries += 1
                stored += len(primary) + len(secondary) + len(record)
        if entries:
            found.append(GroupSize(kg, entries, stored))
    return found


class _Reader:
    def __init__(self, job: Job, descriptor: StateDescriptor) -> None:
        self.job, self.descriptor = job, descriptor
        self.partition = job.partition
        self.table = descriptor.name
        self.nested = descriptor.kind == "map"

    def range(self, groups: KeyGroupRange, after: Position | None) -> Iterator[Stored]:
        for kg in groups:
            if after is not None and kg < after.key_group:
                continue
            if after is not None and kg == after.key_group:
                yield from self._from(kg, after.primary, after.secondary)
            else:
                yield from self._from(kg, None, None)

    def keys(self, groups: KeyGroupRange, keys: Sequence[str | int], after: Position | None) -> Iterator[Stored]:
        """The rows of ``keys`` (each key's namespaces are the primaries it prefixes), in stored order."""
        keyspace, key_type = self.job.keyspace, self.descriptor.key_type
        located = sorted({keyspace.key_prefix(k, key_type) for k in keys})
        for kg, prefix in located:
            if kg not in groups:
                continue
            if after is not None and (kg, prefix) < (after.key_group, after.primary[: len(prefix)]):
                continue
            resume = after is not None and kg == after.key_group and after.primary.startswith(prefix)
            rows = (
                self._from(kg, after.primary, after.secondary)
                if resume and after
                else self._from(kg, _below(prefix), None)
            )
            for row in rows:
                if row[1] < prefix:
                    continue
                if not row[1].startswith(prefix):
                    break
                yield row

    def _from(self, kg: int, primary: bytes | None, secondary: bytes | None) -> Iterator[Stored]:
        """Stored records of key group ``kg`` after ``primary`` (``None``: all of them); with
        ``secondary`` (a map entry's position) the map of ``primary`` resumes after that entry."""
        partition, table = self.partition, self.table
        if self.nested:
            if primary is not None and secondary is not None:
                for sec, raw in partition.items_from(table, kg, primary, secondary):
                    yield kg, primary, sec, raw
            for following in partition.primaries_from(table, kg, primary):
                for sec, raw in partition.items_from(table, kg, following, None):
                    yield kg, following, sec, raw
            return
        primaries = partition.primaries_from(table, kg, primary)
        while chunk := list(islice(primaries, _CHUNK)):
            for stored_key, record in zip(chunk, partition.get_many(table, [kg] * len(chunk), chunk), strict=True):
                if record is not None:
                    yield kg, stored_key, b"", record

    def page(self, stored: Iterator[Stored], max_rows: int, max_bytes: int) -> ScanPage:
        descriptor, ttl = self.descriptor, self.descriptor.ttl
        now = self.job.clock.now_ms()
        rows: list[tuple[int, bytes, bytes, Any, Any]] = []
        used, last = 0, None
        for kg, primary, secondary, raw in stored:
            if len(rows) >= max_rows or (last is not None and used >= max_bytes):
                return self._page(rows, last, used)
            used += len(primary) + len(secondary) + len(raw)
            last = Position(kg, primary, secondary)
            decoded = _decode(descriptor.kind, ttl, raw, now)
            if decoded is not None:
                rows.append((kg, primary, secondary, *decoded))
        return self._page(rows, None, used)

    def _page(self, rows: list[tuple[int, bytes, bytes, Any, Any]], last: Position | None, used: int) -> ScanPage:
        descriptor = self.descriptor
        keys, namespaces = [], []
        for _kg, primary, _s, _v, _e in rows:
            key, ns = decode_primary(primary, descriptor.key_type)
            keys.append(key)
            namespaces.append(ns)
        values = [row[3] for row in rows]
        if descriptor.kind in ("reducing", "aggregating"):
            result = descriptor.state_function.result
            values = [result(v) for v in values]
        columns: dict[str, pa.Array] = {
            "key": pa.array(keys, KEY_TYPES[descriptor.key_type]),
            "ns": pa.array(namespaces, pa.string()),
        }
        if descriptor.kind == "map":
            columns["user_key"] = pa.array([decode_user_key(row[2]) for row in rows], pa.string())
        typed = value_type(descriptor, "map_get" if descriptor.kind == "map" else "get")
        if typed is None:
            columns["value"] = pa.array([_json(v) for v in values], pa.string())
        else:
            columns["value"] = to_arrow(values, descriptor, "map_get" if descriptor.kind == "map" else "get")
        columns["key_group"] = pa.array([row[0] for row in rows], pa.int32())
        if descriptor.ttl is not None:
            columns["expires_at"] = pa.array([row[4] for row in rows], schema(descriptor).field("expires_at").type)
        return ScanPage(pa.Table.from_pydict(columns, schema=schema(descriptor)), last, used)


def _below(prefix: bytes) -> bytes | None:
    """A position just below every primary that ``prefix`` (a key, no namespace) starts: the
    seeking reads start strictly after their position, and a map's skips what extends it."""
    stripped = prefix.rstrip(b"\x00")
    return stripped[:-1] + bytes([stripped[-1] - 1]) if stripped else None


def _decode(kind: str, ttl: Any, raw: bytes, now: int) -> tuple[Any, Any] | None:
    """A stored record's value and expiry by Flink's read rule (``None``: not visible)."""
    if ttl is None:
        return (list(iter_values(raw)), None) if kind == "list" else (decode_value(raw), None)
    if kind == "list":
        stored = list(iter_timestamped(raw))
        if not ttl.return_expired:
            stored = [(ts, v) for ts, v in stored if not is_expired(ts, ttl.ttl_ms, now)]
        if not stored:
            return None
        return [v for _ts, v in stored], [expiration_timestamp(ts, ttl.ttl_ms) for ts, _v in stored]
    timestamp, payload = split_timestamped(raw)
    if is_expired(timestamp, ttl.ttl_ms, now) and not ttl.return_expired:
        return None
    return decode_value(payload), expiration_timestamp(timestamp, ttl.ttl_ms)


def _json(value: Any) -> str:
    return orjson.dumps(value, default=_bytes_as_base64, option=orjson.OPT_NON_STR_KEYS).decode()


def _bytes_as_base64(value: Any) -> Any:
    # JSON has no bytes: as the JSON API answers them.
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
