"""A keyed state read as a table: every (key, namespace[, user key]) of a key-group range, in
pages bounded by rows and stored bytes (what Spark's data source reads, ``client/datasource``).

Rows come in (key group, stored key) order; a page ends after ``max_rows`` rows or once the
stored bytes it read reach ``max_bytes`` (a single record larger than that is a page of its
own), and hands back the position of its last row: the next page seeks past it, so a page
costs what it returns, never the state's size. Reads apply Flink's TTL visibility without
writing (a scan neither expires nor refreshes what it reads, as a savepoint reader would not).

Columns: ``statehouse.snapshots.stored.arrow.schema`` (shared with a checkpoint reader, which reads the
same rows from a checkpoint's stored records).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from statehouse.backends.job import Job
from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.record_columns import records_table, visibility

_POSITION = struct.Struct(">HI")  # key group, primary length; then the primary and the secondary


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
        for stored_key, record in partition.entries_from(table, kg, primary):
            yield kg, stored_key, b"", record

    def page(self, stored: Iterator[Stored], max_rows: int, max_bytes: int) -> ScanPage:
        descriptor = self.descriptor
        now = self.job.clock.now_ms()
        keeps = visibility(descriptor, now)
        groups: list[int] = []
        primaries: list[bytes] = []
        secondaries: list[bytes] = []
        records: list[bytes] = []
        used, last, ended = 0, None, True
        for row in stored:
            if len(records) >= max_rows or (last is not None and used >= max_bytes):
                ended = False
                break
            kg, primary, secondary, raw = last = row
            used += len(primary) + len(secondary) + len(raw)
            if keeps is None or keeps(raw):
                groups.append(kg)
                primaries.append(primary)
                secondaries.append(secondary)
                records.append(raw)
        table = records_table(descriptor, groups, primaries, secondaries, records, now)
        return ScanPage(table, None if ended or last is None else Position(*last[:3]), used)


def _below(prefix: bytes) -> bytes | None:
    """A position just below every primary that ``prefix`` (a key, no namespace) starts: the
    seeking reads start strictly after their position, and a map's skips what extends it."""
    stripped = prefix.rstrip(b"\x00")
    return stripped[:-1] + bytes([stripped[-1] - 1]) if stripped else None
