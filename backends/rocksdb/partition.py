"""RocksDB partition on rocksdict, in raw-bytes mode: the reads and writes of one job's state.

:class:`RocksDBPartition` is the facade the job and the store use. It does the IO; the rest is
its parts': the database's options, key layout and frozen views (``database.py``), its life
cycle — open, leased, closed while idle, reopened (``instance.py``) — and the policy of a full
volume (``degrade.py``, ``space.py``).

Layout (Flink's ``RocksDBKeyedStateBackend``): one column family per table; a RocksDB key
is ``key-group prefix + primary + secondary``, the prefix big-endian in 1 byte when max
parallelism ≤ 128 and 2 bytes otherwise, so every key group — and every range of key
groups — is one contiguous byte range. Job metadata lives in the default column family.

A partition may be closed while idle and reopened on its next use (``OpenInstances`` in
``pool.py`` bounds how many are open): every access to the database holds a lease, and only
a partition without one is closed. Iterators over the live database hold a lease while they
are alive, except :meth:`RocksDBPartition.scan`, which reads in chunks (a TTL cleanup cursor
lives across requests and must not keep its database open).

Out of space (``space.py``): a write is refused (507) while the data volume is below its reserve;
a write or an open that RocksDB fails for lack of space *degrades* the partition — it serves
reads (opened read-only if need be), refuses writes, and is reopened for writing when space
returns. A write RocksDB refused was not applied (a write batch is atomic), and a stopped database
keeps every write it acknowledged in its write-ahead log: reopening replays it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import os
import re
import shutil
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice, repeat, starmap
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy
from rocksdict import (
    BottommostLevelCompaction,
    Cache,
    Checkpoint,
    CompactOptions,
    IngestExternalFileOptions,
    Rdict,
    SstFileWriter,
    WriteBatch,
)

from statehouse.backends.base.partition import Entry, FlatChanges, Guard, RowChanges, StorePartition, WriteOp
from statehouse.backends.reserved import META_TABLE
from statehouse.backends.rocksdb.database import (
    DEFAULT_WAL_LIMIT,
    KeyLayout,
    RocksDBFrozenView,
    TableFiles,
    bounded,
    db_options,
    iterate,
)
from statehouse.backends.rocksdb.degrade import DegradePolicy
from statehouse.backends.rocksdb.instance import DatabaseInstance
from statehouse.backends.rocksdb.row_cache import PartitionRows, RowCache
from statehouse.backends.rocksdb.space import DataVolume, wal_limit
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.stored.codec import split_nested_key
from statehouse.snapshots.stored.keys import key_group_prefix_width, prefix_successor

if TYPE_CHECKING:
    from statehouse.backends.rocksdb.pool import OpenInstances

logger = logging.getLogger(__name__)

_SCAN_CHUNK = 512  # entries a scan reads under one lease
# From this many keys a read goes through RocksDB's multi-get with its keys sorted: once the
# state outgrows the block cache that measured about twice as fast as point gets (bench/RESULTS.md
# §16); a few keys are cheaper one by one.
_MULTI_GET_MIN = 64
_T = TypeVar("_T")
# A write's rows of the tables the row cache holds: per table, keys and values (None: deleted).
_Written = dict[str, tuple[list[bytes], list[bytes | None]]]
_KEY_GROUP, _PRIMARY = operator.itemgetter(0), operator.itemgetter(1)  # of a flat change's key
_SST_NUMBER = re.compile(r"^\s*(\d+):\d+\[", re.MULTILINE)  # a file's line in "rocksdb.sstables"
_SORTED_WRITE_MIN_ROWS = 256  # fewer rows: the sort would gain less than it costs
# Entries a table file is written at a time, holding the interpreter (a few milliseconds).
_FILE_CHUNK = 8_192
# Entries a load sorts into table files at once (whole key groups; ~50 MB of Python objects).
_LOAD_RUN_ENTRIES = 250_000


def _leased(method: Callable[..., _T]) -> Callable[..., _T]:
    """Run a partition method holding a lease on its (re)opened database."""

    @functools.wraps(method)
    def leased(self: RocksDBPartition, *args: Any, **kwargs: Any) -> _T:
        instance = self._instance
        instance.acquire()
        try:
            return method(self, *args, **kwargs)
        finally:
            instance.release()

    return leased


def _write_guard(reserve: bool) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """A write to the database: refused while it is degraded, or (``reserve``) while the volume
    is below its reserve (507); one that RocksDB fails for lack of space degrades it."""

    def guard(method: Callable[..., _T]) -> Callable[..., _T]:
        @functools.wraps(method)
        def writing(self: RocksDBPartition, *args: Any, **kwargs: Any) -> _T:
            policy, instance = self._space, self._instance
            if policy.degraded:
                self.recover()  # space may have come back since
            instance.acquire()
            try:
                policy.require_writable(reserve)
                return policy.writing(instance, method, self, *args, **kwargs)
            finally:
                instance.release()

        return writing

    return guard


_writing = _write_guard(reserve=True)
_freeing = _write_guard(reserve=False)  # dropping a state frees space: allowed below the reserve


def _leased_iter(method: Callable[..., Iterator[_T]]) -> Callable[..., Iterator[_T]]:
    """A generator method whose iteration holds a lease until it ends or is dropped."""

    @functools.wraps(method)
    def leased(self: RocksDBPartition, *args: Any, **kwargs: Any) -> Iterator[_T]:
        instance = self._instance
        instance.acquire()
        try:
            yield from method(self, *args, **kwargs)
        finally:
            instance.release()

    return leased


def _multi_get(family: Rdict, keys: list[bytes]) -> list[bytes | None]:
    """The values of ``keys`` (in their order), read by one multi-get in key order."""
    order = sorted(range(len(keys)), key=keys.__getitem__)
    found = cast("list[bytes | None]", family.get([keys[i] for i in order]))  # a list in: a list out
    values: list[bytes | None] = [None] * len(keys)
    for i, value in zip(order, found, strict=True):
        values[i] = value
    return values


def _read_many(family: Rdict, keys: list[bytes]) -> list[bytes | None]:
    """The values of ``keys``: one multi-get in key order for many, point gets for a few."""
    if len(keys) >= _MULTI_GET_MIN:
        return _multi_get(family, keys)
    return list(map(family.get, keys))


def _put_rows(changes: FlatChanges) -> tuple[Iterable[int], Iterable[bytes], Iterable[bytes | None]] | None:
    """A flat table's changes as (key groups, primaries, values) if none of them deletes; the
    rows of a big columnar put in key-group order."""
    if isinstance(changes, RowChanges):
        if changes.deletes:
            return None
        if len(changes.primaries) >= _SORTED_WRITE_MIN_ROWS:
            return _by_key_group(changes)
        return changes.key_groups, changes.primaries, changes.records
    if None in changes.values():
        return None
    return map(_KEY_GROUP, changes), map(_PRIMARY, changes), changes.values()


def _by_key_group(rows: RowChanges) -> tuple[Sequence[int], Sequence[bytes], Sequence[bytes | None]]:
    """The rows stably sorted by key group: RocksDB's memtable inserts a key beside the one before
    faster than anywhere (measured: 10,000 rows of 100 bytes over 100,000 keys, the write 0.78 ->
    0.58 µs per row, the sort ~0.05), and a later row of a key still follows an earlier one."""
    order = numpy.argsort(numpy.asarray(rows.key_groups, dtype=numpy.int32), kind="stable").tolist()
    pick = operator.itemgetter(*order)
    return pick(rows.key_groups), pick(rows.primaries), pick(rows.records)


class RocksDBPartition(StorePartition):
    """One job's state in its own RocksDB database: the :class:`StorePartition` the job reads and
    writes through, and what the store closes, reopens and swaps on a restore.

    It does the IO (point and many-key reads, seeking listings, chunked scans, write batches,
    range deletes, compactions, native checkpoints) and owns the frozen views it hands out. It
    delegates the database's life — open, leased per access, closed while idle, reopened — to its
    :class:`DatabaseInstance`, and whether a write may go on the full volume to its
    :class:`DegradePolicy`: every access holds a lease on the instance (``_leased``), every write
    also asks the policy (``_writing``, ``_freeing``)."""

    def __init__(
        self,
        path: str,
        max_parallelism: int | None,
        frozen_dir: str | None = None,
        pool: OpenInstances | None = None,
        volume: DataVolume | None = None,
        block_cache: Cache | None = None,
        files: TableFiles | None = None,
        row_cache: RowCache | None = None,
    ) -> None:
        self.path = path
        # The replica's cache of flat tables' rows (None: every read goes to RocksDB).
        self._rows = PartitionRows(row_cache) if row_cache is not None else None
        wal_bytes = wal_limit(volume.reserve_bytes) if volume is not None else DEFAULT_WAL_LIMIT
        self._space = DegradePolicy(volume)
        self._frozen_dir = frozen_dir or path + ".frozen"
        self._frozen_count = 0
        self._files = files or TableFiles()
        started = time.monotonic()
        options = db_options(wal_bytes, block_cache, self._files)
        self._instance = DatabaseInstance(path, max_parallelism, options, pool, self._space)
        # As the database stores it; only another database (a restore's, at reopen) can change it.
        self.max_parallelism = self._instance.max_parallelism
        logger.info("opened RocksDB instance %s in %.0f ms", path, (time.monotonic() - started) * 1000)
        if pool is not None:
            pool.trim()

    # -- the database's life: its instance's -----------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._instance.is_open

    def close_idle(self) -> bool:
        """Close the database if nothing uses it (it reopens on the next access); whether it did."""
        return self._instance.close_idle()

    def close(self) -> None:
        self._invalidate_rows()
        self._instance.close()

    def reopen(self) -> None:
        """Open the database at ``path`` again after :meth:`close` (it may be another one now)."""
        self._instance.reopen()
        self.max_parallelism = self._instance.max_parallelism
        # After: a read between the close and now may have reopened the database it replaced.
        self._invalidate_rows()

    # What tests reach the live database through: a lease, and the open database and families.

    def _acquire(self) -> None:
        self._instance.acquire()

    def _release(self) -> None:
        self._instance.release()

    @property
    def _db(self) -> Rdict:
        return self._instance.db

    @property
    def _families(self) -> dict[str, Rdict]:
        return self._instance.families

    # -- out of space: the policy's -------------------------------------------------------------

    @property
    def degraded(self) -> bool:
        return self._space.degraded

    def recover(self) -> bool:
        """Reopen a degraded database for writing if the volume is above its reserve and nothing
        uses the database now; whether it takes writes (again)."""
        return self._instance.recover()

    # -- reads -------------------------------------------------------------------------

    def tables(self) -> dict[str, bool]:
        return dict(self._instance.nested)

    def _cached(self, table: str) -> PartitionRows | None:
        """The row cache, if ``table``'s rows are kept in it: a flat keyed table's."""
        rows = self._rows
        if rows is None or table == META_TABLE or self._instance.nested.get(table, True):
            return None
        return rows

    def _invalidate_rows(self) -> None:
        if self._rows is not None:
            self._rows.invalidate()

    @_leased
    def get(self, table: str, key_group: int, primary: bytes, secondary: bytes = b"") -> bytes | None:
        instance = self._instance
        family = instance.families[table]
        key = instance.layout.key(table, key_group, primary, secondary)
        rows = self._cached(table)
        if rows is None:
            return family.get(key)
        return rows.read(table, [key], functools.partial(_read_many, family))[0]

    @_leased
    def get_many(
        self,
        table: str,
        key_groups: Sequence[int],
        primaries: Sequence[bytes],
        secondaries: Sequence[bytes] | None = None,
        budget: int | None = None,
    ) -> list[bytes | None]:
        if table == META_TABLE:
            return super().get_many(table, key_groups, primaries, secondaries)
        instance = self._instance
        family = instance.families[table]
        keys = instance.layout.keys(key_groups, primaries, secondaries)
        rows = self._cached(table)
        if rows is not None:
            return rows.read(table, keys, functools.partial(_read_many, family), budget)
        if budget is None:
            return _read_many(family, keys)
        values = map(family.get, keys)
        found: list[bytes | None] = []  # each get copies its value: stop once they pass the budget
        add = found.append
        for value in values:
            add(value)
            if value is not None:
                budget -= len(value)
                if budget < 0:
                    break
        return found

    @_leased_iter
    def items(self, table: str, key_group: int, primary: bytes) -> Iterator[tuple[bytes, bytes]]:
        yield from self._under(table, self._instance.layout.key(table, key_group, primary), None)

    def _under(self, table: str, prefix: bytes, after: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """``(key after prefix, value)`` of the keys under ``prefix`` whose rest sorts after
        ``after``: one iterator seeked past it and bounded to the prefix, nothing before it read."""
        start = prefix if after is None else prefix + after + b"\x00"  # the least key above prefix + after
        n = len(prefix)
        for key, value in iterate(self._instance.families[table], start, prefix_successor(prefix)):
            yield key[n:], value

    def scan(self, table: str, key_group: int) -> Iterator[tuple[bytes, bytes, bytes]]:
        # In chunks, each read under its own lease: a scan left open (a TTL cleanup cursor)
        # holds no database open. Each chunk sees the data as of its read.
        lower = self._instance.layout.scan_prefix(table, key_group)
        upper = prefix_successor(lower)
        split = self._instance.layout.splitter(table)
        while True:
            chunk = self._chunk(table, lower, upper)
            for key, value in chunk:
                yield (*split(key), value)
            if len(chunk) < _SCAN_CHUNK:
                return
            lower = chunk[-1][0] + b"\x00"  # the least key after the last one read

    @_leased
    def _chunk(self, table: str, lower: bytes, upper: bytes | None) -> list[tuple[bytes, bytes]]:
        return list(islice(iterate(self._instance.families[table], lower, upper), _SCAN_CHUNK))

    @_leased_iter
    def items_from(
        self, table: str, key_group: int, primary: bytes, after: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        yield from self._under(table, self._instance.layout.key(table, key_group, primary), after)

    @_leased_iter
    def entries_from(self, table: str, key_group: int, after: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        if self._instance.nested.get(table, False):
            raise ValueError(f"entries_from reads flat tables; {table!r} is nested")
        yield from self._under(table, self._instance.layout.scan_prefix(table, key_group), after)

    @_leased_iter
    def primaries_from(self, table: str, key_group: int, after: bytes | None) -> Iterator[bytes]:
        family, prefix = self._instance.families[table], self._instance.layout.scan_prefix(table, key_group)
        n, end = len(prefix), prefix_successor(prefix)
        start = prefix if after is None else prefix + after + b"\x00"
        if not self._instance.nested.get(table, False):
            for key, _value in iterate(family, start, end):
                yield key[n:]
            return
        # A map is one primary over many keys: take its primary, then seek past all of its
        # entries (primaries are self-delimiting, so they are exactly the keys it prefixes).
        if after is not None:
            start = prefix_successor(prefix + after) or start
        it = bounded(family, start, end)
        while it.valid():
            primary, _secondary = split_nested_key(it.key(), n)
            yield primary
            following = prefix_successor(prefix + primary)
            if following is None:
                break
            it.seek(following)
        del it

    # -- writes ------------------------------------------------------------------------

    def create_table(self, table: str, nested: bool) -> None:
        if table not in self._instance.nested:  # opening a job "creates" its tables: no write, also when degraded
            self._create_table(table, nested)

    @_writing
    def _create_table(self, table: str, nested: bool) -> None:
        self._instance.add_table(table, nested)

    @_freeing
    def drop_table(self, table: str) -> None:
        try:
            self._instance.remove_table(table)
        finally:
            self._invalidate_rows()

    @_writing
    def write(self, ops: list[WriteOp]) -> None:
        batch = WriteBatch(raw_mode=True)
        written: _Written = {}
        self._add_ops(batch, ops, written)
        self._instance.db.write(batch)
        self._written(written)

    def _written(self, written: _Written) -> None:
        if self._rows is not None and written:
            self._rows.written(written)

    def _cached_rows(self, written: _Written, table: str) -> tuple[list[bytes], list[bytes | None]] | None:
        """Where a write to ``table`` notes its keys and values for the row cache, if it holds the table's rows."""
        if self._cached(table) is None:
            return None
        return written.setdefault(table, ([], []))

    @_writing
    def write_changes(self, flat: Mapping[str, FlatChanges], ops: list[WriteOp]) -> None:
        batch = WriteBatch(raw_mode=True)
        handles, layout = self._instance.handles, self._instance.layout
        written: _Written = {}
        for table, changes in flat.items():
            handle = handles[table]
            if table == META_TABLE:
                for (kg, primary), value in changes.items():
                    key = layout.key(table, kg, primary)
                    batch.put(key, value, handle) if value is not None else batch.delete(key, handle)
                continue
            prefix, put, delete = layout.prefixes, batch.put, batch.delete
            cached = self._cached_rows(written, table)
            rows = _put_rows(changes)
            if rows is not None:
                # Puts only (a columnar request's rows in order, or a big one's stably in key-group
                # order: a later row of a key written later and winning; or a dict of changes): the
                # keys and the batch's puts in C loops, no Python step per row.
                key_groups, primaries, records = rows
                keys: Iterable[bytes] = map(operator.add, map(prefix.__getitem__, key_groups), primaries)
                if cached is not None:
                    keys, records = list(keys), list(records)
                    cached[0].extend(keys)
                    cached[1].extend(records)
                deque(map(put, keys, records, repeat(handle)), maxlen=0)
                continue
            for (kg, primary), value in changes.items():
                key = prefix[kg] + primary
                if value is None:
                    delete(key, handle)
                else:
                    put(key, value, handle)
                if cached is not None:
                    cached[0].append(key)
                    cached[1].append(value)
        self._add_ops(batch, ops, written)
        self._instance.db.write(batch)
        self._written(written)

    def write_table_file(self, path: str, entries: Iterable[tuple[bytes, bytes]]) -> int:
        """Write ``entries`` (``(key, value)``, keys in this partition's layout and ascending) into a
        new table file at ``path`` for :meth:`ingest_table_file`, without touching the database;
        how many (none: no file)."""
        writer = SstFileWriter(self._instance.options)
        writer.open(path)
        source, put, written = iter(entries), writer.__setitem__, 0
        # C loops, no Python step per entry; back in Python between chunks, where the interpreter
        # lets the replica's other threads (its requests) run.
        while chunk := list(islice(source, _FILE_CHUNK)):
            deque(starmap(put, chunk), maxlen=0)
            written += len(chunk)
        if written:
            writer.finish()
        else:  # RocksDB refuses to finish a file of no entry
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        return written

    def ingest_table_file(self, table: str, path: str, key_groups: KeyGroupRange, guard: Guard) -> None:
        """Add a table file :meth:`write_table_file` wrote to ``table`` (inside ``guard()``), its
        entries in ``key_groups``; they replace any stored under the same keys. The file is gone
        after."""
        try:
            with guard():
                self._ingest(table, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)  # the database holds its own link, or a copy
        # A file SstFileWriter wrote names no column family until a compaction rewrites it, and
        # RocksDB's repair, which a read of some key groups of an incremental checkpoint relies on,
        # sets such a file aside. Rewritten now, in RocksDB's threads (~0.4 s of CPU per million
        # entries; requests go on): the database holds only files of its own. A rewrite that fails
        # (a full volume) leaves the file as ingested, which such a read then downloads whole.
        try:
            self.compact_key_groups([table], [key_groups], force=True)
        except Exception as exc:  # rocksdict raises bare Exceptions
            logger.warning("table %s of %s: the ingested file stays as it is: %s", table, self.path, exc)

    @_writing
    def _ingest(self, table: str, path: str) -> None:
        # RocksDB's external file ingestion: the file joins the table as it is (hard-linked when it
        # can be), at the lowest level it fits, its entries newer than any stored before; no
        # write-ahead log, memtable or compaction for each entry as writes would cost.
        options = IngestExternalFileOptions()
        options.set_move_files(True)
        try:
            self._instance.families[table].ingest_external_file([path], options)
        finally:
            self._invalidate_rows()

    def load_entries(self, entries: Iterable[Entry], directory: str, guard: Guard) -> int:
        # A run of whole key groups at a time, each table's entries sorted into one table file:
        # files of a table never overlap, and memory holds one run.
        width = key_group_prefix_width(self.max_parallelism)
        run: dict[str, list[tuple[bytes, bytes]]] = {}
        loaded = size = 0
        prefix, last = b"", -1
        for kg, table, primary, secondary, value in entries:
            if kg != last:
                if size >= _LOAD_RUN_ENTRIES:
                    loaded += self._load_run(run, width, directory, guard)
                    run, size = {}, 0
                prefix, last = kg.to_bytes(width, "big"), kg
            run.setdefault(table, []).append((prefix + primary + secondary, value))
            size += 1
        return loaded + self._load_run(run, width, directory, guard)

    def _load_run(self, run: dict[str, list[tuple[bytes, bytes]]], width: int, directory: str, guard: Guard) -> int:
        for table, entries in run.items():
            entries.sort()  # by key: a table's keys are unique
            path = os.path.join(directory, f"load-{uuid.uuid4().hex}.sst")
            if self.write_table_file(path, entries):
                first, last = entries[0][0][:width], entries[-1][0][:width]
                key_groups = KeyGroupRange(int.from_bytes(first, "big"), int.from_bytes(last, "big"))
                self.ingest_table_file(table, path, key_groups, guard)
        return sum(map(len, run.values()))

    @_freeing
    def drop_key_groups(self, tables: Sequence[str], ranges: Sequence[KeyGroupRange]) -> None:
        # Keys start with their key group (KeyLayout), so a range of key groups is one byte range
        # of each column family: one range tombstone each, in one atomic batch, nothing read.
        batch = WriteBatch(raw_mode=True)
        bounds = self._key_group_bounds(ranges)
        for table in tables:
            handle = self._instance.handles[table]
            for begin, end in bounds:
                batch.delete_range(begin, end, handle)
        try:
            self._instance.db.write(batch)
        finally:
            self._invalidate_rows()

    def reclaim_key_groups(self, tables: Sequence[str], ranges: Sequence[KeyGroupRange]) -> None:
        # A range tombstone hides the data but the table files keep it until a compaction reaches
        # them, which nothing may trigger: the disk, and every later incremental checkpoint's
        # files (what the next rescale downloads), would carry it. Compacting just those ranges
        # rewrites the files they touch (~1 s per million entries), while writes go on. A partition
        # closed meanwhile (its job deleted) has nothing left to reclaim.
        if not self._instance.closed:
            self.compact_key_groups(tables, ranges)

    @_leased
    def compact_key_groups(
        self,
        tables: Sequence[str],
        ranges: Sequence[KeyGroupRange],
        file_bytes: int | None = None,
        force: bool = False,
    ) -> None:
        """Compact these key groups of these tables (RocksDB rewrites every table file that holds
        any of them, level 0's included, down the levels), while writes go on. ``file_bytes``: cut
        the files it writes at about that size instead of the table's target, so each holds a
        narrow run of key groups (and rewrite those at the last level too). ``force``: rewrite
        every file at the last level, even one a compaction would move down whole."""
        options = CompactOptions()
        if force:
            options.set_bottommost_level_compaction(BottommostLevelCompaction.force())
        elif file_bytes is not None:
            # Rewrite files already at the last level too: a lone file RocksDB would otherwise
            # move down whole (a trivial move) keeps spanning what it spanned.
            options.set_bottommost_level_compaction(BottommostLevelCompaction.force_optimized())
        for table in tables:
            family = self._instance.families.get(table)
            if family is None:
                continue
            if file_bytes is not None:
                family.set_options({"target_file_size_base": str(file_bytes)})
            try:
                for begin, end in self._key_group_bounds(ranges):
                    family.compact_range(begin, end, options)
            finally:
                if file_bytes is not None:
                    family.set_options({"target_file_size_base": str(self._files.target_file_bytes)})

    def _key_group_bounds(self, ranges: Sequence[KeyGroupRange]) -> list[tuple[bytes, bytes]]:
        """Each range of key groups as the byte range [begin, end) its keys fill."""
        width = self._instance.layout.prefix_width
        bounds = []
        for r in ranges:
            end = prefix_successor(r.end.to_bytes(width, "big"))
            assert end is not None  # a key group's prefix is below 0x80..: never all 0xff
            bounds.append((r.start.to_bytes(width, "big"), end))
        return bounds

    def _add_ops(self, batch: WriteBatch, ops: list[WriteOp], written: _Written) -> None:
        instance = self._instance
        handles, layout, nested = instance.handles, instance.layout, instance.nested
        for op in ops:
            handle = handles[op.table]
            if op.kind != "put" and op.kind != "delete" and nested[op.table]:
                begin = layout.key(op.table, op.key_group, op.primary)
                end = prefix_successor(begin)
                assert end is not None  # a key starts with its key group (< 0x80): never all 0xff
                batch.delete_range(begin, end, handle)
                continue
            # A put, a delete, or a flat table's clear: one key.
            secondary = op.secondary if op.kind != "clear" else b""
            key = layout.key(op.table, op.key_group, op.primary, secondary)
            value = op.value if op.kind == "put" else None
            if op.kind == "put":
                batch.put(key, value, handle)
            else:
                batch.delete(key, handle)
            cached = self._cached_rows(written, op.table)
            if cached is not None:
                cached[0].append(key)
                cached[1].append(value)

    # -- snapshots ---------------------------------------------------------------------

    @_leased
    def flush(self) -> None:
        # RocksDB releases the GIL while it flushes, and writes go on into new memtables;
        # the checkpoint in freeze() then only flushes what arrived meanwhile.
        for family in list(self._instance.families.values()):
            family.flush()

    @_leased
    def freeze(self) -> RocksDBFrozenView:
        # Flushes the memtables and hard-links the SST files: milliseconds, not a copy.
        self._frozen_count += 1
        path = os.path.join(self._frozen_dir, f"{os.getpid()}-{self._frozen_count}")
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(self._frozen_dir, exist_ok=True)
        Checkpoint(self._instance.db).create_checkpoint(path)
        return RocksDBFrozenView(path, KeyLayout(self.max_parallelism, dict(self._instance.nested)))

    @_leased
    def file_spans(self, tables: Iterable[str]) -> dict[str, tuple[str, int, int]]:
        """Each table file of these (keyed) tables: ``(table, first key group, last key group)``
        of its smallest and largest key, as the MANIFEST records them (they bound its range
        deletions too). A key group's keys start with its prefix, so no key of another key group
        lies in a file; a bound shorter than the prefix is padded with zeros, which only widens
        the span. Read right after :meth:`freeze` (under the job's lock), these are the frozen
        checkpoint's files, less any that a compaction replaced meanwhile: those get no span, so a
        restore always reads them."""
        width = self._instance.layout.prefix_width
        bounds = {
            int(os.path.basename(f["name"]).split(".")[0]): (f["start_key"], f["end_key"])
            for f in self._instance.db.live_files()
        }
        owners: dict[int, list[str]] = {}
        for table in tables:
            # rocksdict's live_files() does not say a file's column family; the family's own
            # listing of its files (a debug dump, one " <number>:<size>[..." line per file) does.
            listing = self._instance.families[table].property_value("rocksdb.sstables") or ""
            for number in _SST_NUMBER.findall(listing):
                owners.setdefault(int(number), []).append(table)
        spans = {}
        for number, owner in owners.items():
            if len(owner) != 1 or number not in bounds:
                continue  # not understood: no span, so the file is always read
            start, end = bounds[number]
            first = int.from_bytes(start[:width].ljust(width, b"\0"), "big")
            last = int.from_bytes(end[:width].ljust(width, b"\0"), "big")
            spans[f"{number:06d}.sst"] = (owner[0], first, last)
        return spans

    def identity(self) -> str:
        """RocksDB's unique id of this database (a restore or a new job makes a new one)."""
        with open(os.path.join(self.path, "IDENTITY")) as f:
            return f.read().strip()
