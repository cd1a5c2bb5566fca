"""RocksDB partition on rocksdict, in raw-bytes mode.

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

import functools
import gc
import itertools
import logging
import operator
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice, repeat
from typing import TYPE_CHECKING, Any, TypeVar

import numpy
from rocksdict import (
    AccessType,
    BlockBasedOptions,
    BottommostLevelCompaction,
    Cache,
    Checkpoint,
    ColumnFamily,
    CompactOptions,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
)

from statehouse.backends.base.partition import FlatChanges, FrozenView, RowChanges, StorePartition, WriteOp
from statehouse.backends.errors import InsufficientStorage
from statehouse.backends.reserved import BROADCAST_TABLE, LIST_TABLE, META_TABLE
from statehouse.backends.rocksdb.space import DataVolume, is_out_of_space, wal_limit
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.stored.codec import split_nested_key
from statehouse.snapshots.stored.keys import DEFAULT_FAMILY, column_family, key_group_prefix_width, prefix_successor

if TYPE_CHECKING:
    from statehouse.backends.rocksdb.pool import OpenInstances

logger = logging.getLogger(__name__)

# Table files one instance keeps open (RocksDB's default, -1, keeps every SST file open): with
# the open-instance bound, this bounds a replica's file descriptors.
MAX_OPEN_FILES = 64
_SCAN_CHUNK = 512  # entries a scan reads under one lease
# Column families a new database is created with: every job makes these tables, and creating
# them with the database writes RocksDB's OPTIONS file once instead of once per table.
_WITH_NEW_DATABASE = (LIST_TABLE, BROADCAST_TABLE)
_TICKS = itertools.count(1)  # last-use stamps, for the least recently used instance
_T = TypeVar("_T")
_MAX_PARALLELISM_KEY = b"max_parallelism"
_NESTED_PREFIX = b"table-nested:"
_META_PREFIX = b"meta:"
_KEY_GROUP, _PRIMARY = operator.itemgetter(0), operator.itemgetter(1)  # of a flat change's key
_SST_NUMBER = re.compile(r"^\s*(\d+):\d+\[", re.MULTILINE)  # a file's line in "rocksdb.sstables"
_SORTED_WRITE_MIN_ROWS = 256  # fewer rows: the sort would gain less than it costs


# RocksDB's default size of the table files a compaction writes (target_file_size_base).
_TARGET_FILE_BYTES = 64 << 20
# A job's write-ahead logs without a data volume's reserve to fit in (staged restores, readers).
_DEFAULT_WAL_LIMIT = 64 << 20


def db_options(max_wal_bytes: int = _DEFAULT_WAL_LIMIT, block_cache: Cache | None = None) -> Options:
    """The options of every job's database and column family; ``block_cache``: the replica's
    shared cache of data, index and filter blocks (None: RocksDB's own 8 MiB per database)."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_max_open_files(MAX_OPEN_FILES)
    # The table cache that bound makes (~54 files) in one shard: RocksDB's default 64 shards give
    # each room for one file, and two files of a job hashed to one shard evict each other on
    # every read, which then reads the file's index and Bloom filter again (a million-key state:
    # ~1.5 MB a read, point reads 20-50x slower until the files change; measured in bench/replica.py).
    options.set_table_cache_num_shard_bits(0)
    options.set_keep_log_file_num(3)  # every reopen rolls the info LOG; keep a few, not 1000
    # Past this, RocksDB flushes the column families that keep the oldest log alive (by default it
    # lets logs grow to 4x all memtables): the log an open replays, and the table files that
    # replay writes before the log is deleted, stay bounded; see space.wal_limit.
    options.set_max_total_wal_size(max_wal_bytes)
    # A point read (a get; the read of a read-modify-write add) skips the files that do not hold
    # its key: a Bloom filter of 10 bits per key (~1% false positives, ~1.25 bytes per key in
    # memory), as Kafka Streams sets by default and Flink offers (use-bloom-filter). Measured on
    # 1M keys over a few flushed files: 2.7 -> 1.3 µs per read of a mostly new key. Files
    # written before it have none until compaction rewrites them.
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    if block_cache is not None:
        table.set_block_cache(block_cache)
    options.set_block_based_table_factory(table)
    return options


def remove_partial_files(path: str, families: Mapping[str, Options]) -> list[str]:
    """Remove the table files an open that failed for lack of space left in a database directory:
    ``*.sst`` files its MANIFEST does not list (RocksDB removes those itself only once an open
    succeeds, and each failed open of a full volume wrote more). Nothing may have it open."""
    reader = Rdict(path, db_options(), column_families=dict(families), access_type=AccessType.read_only())
    try:
        live = {os.path.basename(f["name"]) for f in reader.live_files()}
    finally:
        reader.close()
    removed = sorted(name for name in os.listdir(path) if name.endswith(".sst") and name not in live)
    for name in removed:
        os.remove(os.path.join(path, name))
    return removed


def rebuild_manifest(path: str, tables: Iterable[str]) -> list[str]:
    """Make a database whose MANIFEST lists table files that are not there (a checkpoint
    downloaded in part) openable from the files that are: RocksDB's repair writes a new MANIFEST
    listing every file present in its column family (from the file's own properties), all at
    level 0, where reads resolve a key's versions by sequence number as before; a table none of
    whose files is present gets an empty column family. Returns the table files it lists; a file
    repair could not read would be missing from them (repair sets it aside), so the caller checks."""
    options = db_options()
    options.set_disable_auto_compactions(True)  # read once, then removed: nothing to compact
    Rdict.repair(path, options)
    families = {cf: options for cf in Rdict.list_cf(path, options) if cf != DEFAULT_FAMILY}
    families.update({column_family(t): options for t in tables if t != META_TABLE})
    db = Rdict(path, options, column_families=families)
    try:
        return sorted(os.path.basename(f["name"]) for f in db.live_files())
    finally:
        db.close()


def _leased(method: Callable[..., _T]) -> Callable[..., _T]:
    """Run a partition method holding a lease on its (re)opened database."""

    @functools.wraps(method)
    def leased(self: RocksDBPartition, *args: Any, **kwargs: Any) -> _T:
        self._acquire()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._release()

    return leased


def _write_guard(reserve: bool) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """A write to the database: refused while it is degraded, or (``reserve``) while the volume
    is below its reserve (507); one that RocksDB fails for lack of space degrades it."""

    def guard(method: Callable[..., _T]) -> Callable[..., _T]:
        @functools.wraps(method)
        def writing(self: RocksDBPartition, *args: Any, **kwargs: Any) -> _T:
            if self._degraded:
                self.recover()  # space may have come back since
            self._acquire()
            try:
                self._require_writable(reserve)
                return _out_of_space_degrades(self, method, *args, **kwargs)
            finally:
                self._release()

        return writing

    return guard


def _out_of_space_degrades(partition: RocksDBPartition, method: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    try:
        return method(partition, *args, **kwargs)
    except Exception as exc:
        if not is_out_of_space(exc):
            raise
        partition._degrade()
        raise InsufficientStorage(
            f"the data volume is full ({exc}); the write was not applied, and the job takes writes "
            "again once space is freed"
        ) from exc


_writing = _write_guard(reserve=True)
_freeing = _write_guard(reserve=False)  # dropping a state frees space: allowed below the reserve


def _leased_iter(method: Callable[..., Iterator[_T]]) -> Callable[..., Iterator[_T]]:
    """A generator method whose iteration holds a lease until it ends or is dropped."""

    @functools.wraps(method)
    def leased(self: RocksDBPartition, *args: Any, **kwargs: Any) -> Iterator[_T]:
        self._acquire()
        try:
            yield from method(self, *args, **kwargs)
        finally:
            self._release()

    return leased


def _bounded(source, lower: bytes, upper: bytes | None) -> Any:
    """A RocksDB iterator over [lower, upper) (``None``: to the end), seeked to ``lower``."""
    read_options = ReadOptions()
    read_options.set_iterate_lower_bound(lower)
    if upper is not None:
        read_options.set_iterate_upper_bound(upper)
    it = source.iter(read_options)
    it.seek(lower)
    return it


def _iterate(source, lower: bytes, upper: bytes | None) -> Iterator[tuple[bytes, bytes]]:
    it = _bounded(source, lower, upper)
    while it.valid():
        yield it.key(), it.value()
        it.next()
    del it


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


class KeyLayout:
    """How a table's ``(key group, primary, secondary)`` maps to a RocksDB key, and back."""

    def __init__(self, max_parallelism: int, nested: dict[str, bool]) -> None:
        self.prefix_width = key_group_prefix_width(max_parallelism)
        self.nested = nested  # table -> nested; the partition's own, updated as tables come and go
        # Every key group's prefix, built once: rows of a columnar request index into it.
        self.prefixes = [kg.to_bytes(self.prefix_width, "big") for kg in range(max_parallelism)]

    def keys(
        self, key_groups: Sequence[int], primaries: Sequence[bytes], secondaries: Sequence[bytes] | None
    ) -> list[bytes]:
        """:meth:`key` of many rows of a keyed (not the meta) table."""
        prefix = self.prefixes
        if secondaries is None:
            return [prefix[kg] + p for kg, p in zip(key_groups, primaries, strict=True)]
        return [prefix[kg] + p + s for kg, p, s in zip(key_groups, primaries, secondaries, strict=True)]

    def key(self, table: str, key_group: int, primary: bytes, secondary: bytes = b"") -> bytes:
        if table == META_TABLE:
            return _META_PREFIX + primary
        return key_group.to_bytes(self.prefix_width, "big") + primary + secondary

    def scan_prefix(self, table: str, key_group: int) -> bytes:
        """The prefix every key of one key group of a table starts with."""
        return _META_PREFIX if table == META_TABLE else key_group.to_bytes(self.prefix_width, "big")

    def splitter(self, table: str) -> Callable[[bytes], tuple[bytes, bytes]]:
        """How to cut a stored key of ``table`` back into (primary, secondary)."""
        prefix_len = len(self.scan_prefix(table, 0))
        if table == META_TABLE or not self.nested.get(table, False):
            return lambda key: (key[prefix_len:], b"")
        return lambda key: split_nested_key(key, prefix_len)

    def scan(self, family: Rdict, table: str, key_group: int) -> Iterator[tuple[bytes, bytes, bytes]]:
        lower = self.scan_prefix(table, key_group)
        split = self.splitter(table)
        for key, value in _iterate(family, lower, prefix_successor(lower)):
            yield (*split(key), value)


class RocksDBFrozenView(FrozenView):
    """A RocksDB native checkpoint (hard links to the immutable SST files), opened read-only.

    rocksdict's ``Snapshot`` serves point reads at the snapshot but its iterators read the
    live database, so a consistent scan needs a checkpoint (Flink's incremental strategy
    takes the same one in its synchronous part).
    """

    def __init__(self, path: str, layout: KeyLayout):
        self.path = path
        self._layout = layout
        self._tables = layout.nested
        self._db: Rdict | None = None
        self._families: dict[str, Rdict] = {}

    def tables(self) -> dict[str, bool]:
        return dict(self._tables)

    def _family(self, table: str) -> Rdict:
        if self._db is None:
            names = [t for t in self._tables if t != META_TABLE]
            self._db = Rdict(
                self.path,
                db_options(),
                column_families={column_family(t): db_options() for t in names},
                access_type=AccessType.read_only(),
            )
        family = self._families.get(table)
        if family is None:
            family = self._db if table == META_TABLE else self._db.get_column_family(column_family(table))
            self._families[table] = family
        return family

    def scan(self, table: str, key_group: int) -> Iterator[tuple[bytes, bytes, bytes]]:
        return self._layout.scan(self._family(table), table, key_group)

    def stored_max_parallelism(self) -> int | None:
        stored = self._family(META_TABLE).get(_MAX_PARALLELISM_KEY)
        return None if stored is None else int(stored)

    def release(self) -> None:
        # No gc.collect() here: a read-only instance holds no lock that a reopen would wait
        # for, and a full collection stalls the request-serving thread for tens of ms.
        self._families.clear()
        if self._db is not None:
            self._db.close()
            self._db = None
        shutil.rmtree(self.path, ignore_errors=True)


class RocksDBPartition(StorePartition):
    def __init__(
        self,
        path: str,
        max_parallelism: int | None,
        frozen_dir: str | None = None,
        pool: OpenInstances | None = None,
        volume: DataVolume | None = None,
        block_cache: Cache | None = None,
    ) -> None:
        self.path = path
        self._volume = volume  # None: no reserve (staged restores, snapshot readers)
        wal_bytes = wal_limit(volume.reserve_bytes) if volume is not None else _DEFAULT_WAL_LIMIT
        self._options = db_options(wal_bytes, block_cache)
        self._degraded = False  # failed for lack of space, or open read-only: no writes until reopened
        self._frozen_dir = frozen_dir or path + ".frozen"
        self._frozen_count = 0
        self._pool = pool  # None: stays open until closed (staged restores, snapshot readers)
        self._guard = threading.Lock()  # opening, closing and the lease count
        self._leases = 0  # accesses in progress (and live iterators)
        self._is_open = False
        self.last_used = 0
        self._closed = False
        started = time.monotonic()
        self._open(max_parallelism)
        self._opened()
        logger.info("opened RocksDB instance %s in %.0f ms", path, (time.monotonic() - started) * 1000)
        if pool is not None:
            pool.trim()

    # -- open instances: leases, idle close, reopen ---------------------------------------

    def _opened(self) -> None:
        self.last_used = next(_TICKS)
        if self._pool is not None:
            self._pool.add(self)

    def _acquire(self) -> None:
        """Hold the database open (reopening it if it was closed while idle)."""
        with self._guard:
            if self._closed:
                raise RuntimeError(f"the state partition at {self.path} is closed")
            self._leases += 1
            if self._is_open:
                self.last_used = next(_TICKS)
                return
            started = time.monotonic()
            try:
                self._open(None)
            except BaseException:
                self._leases -= 1
                raise
            self._opened()
            # Debug: with more jobs than STATEHOUSE_MAX_OPEN_JOBS this is routine, per request.
            logger.debug("reopened idle RocksDB instance %s in %.0f ms", self.path, (time.monotonic() - started) * 1000)
        if self._pool is not None:
            self._pool.trim()

    def _release(self) -> None:
        with self._guard:
            self._leases -= 1

    def close_idle(self) -> bool:
        """Close the database if nothing uses it (it reopens on the next access); whether it did."""
        with self._guard:
            if not self._is_open or self._leases or self._closed:
                return False
            self._close_db()
            logger.debug("closed idle RocksDB instance %s (STATEHOUSE_MAX_OPEN_JOBS)", self.path)
            return True

    @property
    def is_open(self) -> bool:
        return self._is_open

    def _open(self, max_parallelism: int | None) -> None:
        path = self.path
        is_new = not os.path.exists(os.path.join(path, "CURRENT"))
        existing = [] if is_new else Rdict.list_cf(path, self._options)
        if not existing and max_parallelism is not None:
            existing = [column_family(table) for table in _WITH_NEW_DATABASE]
        families = {cf: self._options for cf in existing if cf != DEFAULT_FAMILY}
        self._column_families = set(families)  # may exceed the tables: see create_table
        try:
            self._db = self._open_writable(families)
        except Exception as exc:
            if not is_out_of_space(exc):
                raise
            if is_new:  # nothing to read yet
                raise InsufficientStorage(
                    f"the data volume is full: a new job's database cannot be created ({exc})"
                ) from exc
            # Opening replays the write-ahead log into new table files first: without the room
            # for them, drop what the failed attempt wrote and serve reads read-only until it returns.
            removed = remove_partial_files(path, families)
            if removed:
                logger.warning("%s: removed %d partial table files of a failed open", path, len(removed))
            try:
                self._db = self._open_writable(families)
            except Exception as again:
                if not is_out_of_space(again):
                    raise
                self._db = Rdict(path, self._options, column_families=families, access_type=AccessType.read_only())
                self._degrade()
                logger.warning("%s opened read-only: no room to replay its write-ahead log (%s)", path, again)
        self._is_open = True
        stored = self._db.get(_MAX_PARALLELISM_KEY)
        if stored is not None:
            self.max_parallelism = int(stored)
        elif max_parallelism is None:
            self._close_db()
            raise FileNotFoundError(f"no state partition at {path}")
        else:
            self.max_parallelism = max_parallelism
            self._db.put(_MAX_PARALLELISM_KEY, str(max_parallelism).encode())
        self._nested: dict[str, bool] = {META_TABLE: False}
        for key, value in _iterate(self._db, _NESTED_PREFIX, prefix_successor(_NESTED_PREFIX)):
            self._nested[key[len(_NESTED_PREFIX) :].decode()] = value == b"1"
        self._layout = KeyLayout(self.max_parallelism, self._nested)
        self._families: dict[str, Rdict] = {}
        self._handles: dict[str, ColumnFamily] = {}
        for table in self._nested:
            self._open_family(table)

    def _open_writable(self, families: dict[str, Options]) -> Rdict:
        try:
            return Rdict(self.path, self._options, column_families=families)
        except Exception as exc:
            # The lock of a database closed moments ago is held until its last Rdict object is
            # gone: a leftover one in a reference cycle (an exception's traceback) goes with a
            # collection. Only here, not on every close.
            if "lock" not in str(exc).lower():
                raise
            gc.collect()
            return Rdict(self.path, self._options, column_families=families)

    # -- out of space ------------------------------------------------------------------------

    def _require_writable(self, reserve: bool) -> None:
        if self._degraded:
            raise InsufficientStorage(
                "the data volume ran out of space: this job serves reads but takes no writes until space is "
                "freed (it is reopened for writing by itself)"
            )
        if reserve and self._volume is not None:
            self._volume.require()

    def _degrade(self) -> None:
        self._degraded = True
        if self._volume is not None:
            self._volume.degraded(self)

    @property
    def degraded(self) -> bool:
        return self._degraded

    def recover(self) -> bool:
        """Reopen a degraded database for writing if the volume is above its reserve and nothing
        uses the database now; whether it takes writes (again)."""
        with self._guard:
            if not self._degraded:
                return True
            if self._leases or (self._volume is not None and not self._volume.room_to_reopen()):
                return False
            if self._is_open:
                self._close_db()  # also forgets the degraded state
            if self._closed:
                return True
            self._open(None)  # degrades again if the volume is still too full to open writable
            self._opened()
            return not self._degraded

    def _open_family(self, table: str) -> None:
        if table == META_TABLE:
            self._families[table] = self._db
            self._handles[table] = self._db.get_column_family_handle(DEFAULT_FAMILY)
        else:
            self._families[table] = self._db.get_column_family(column_family(table))
            self._handles[table] = self._db.get_column_family_handle(column_family(table))

    # -- reads -------------------------------------------------------------------------

    def tables(self) -> dict[str, bool]:
        return dict(self._nested)

    @_leased
    def get(self, table: str, key_group: int, primary: bytes, secondary: bytes = b"") -> bytes | None:
        return self._families[table].get(self._layout.key(table, key_group, primary, secondary))

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
        # Point gets in a loop: rocksdict's multi-get measured no faster here.
        values = map(self._families[table].get, self._layout.keys(key_groups, primaries, secondaries))
        if budget is None:
            return list(values)
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
        prefix = self._layout.key(table, key_group, primary)
        n = len(prefix)
        for key, value in _iterate(self._families[table], prefix, prefix_successor(prefix)):
            yield key[n:], value

    def scan(self, table: str, key_group: int) -> Iterator[tuple[bytes, bytes, bytes]]:
        # In chunks, each read under its own lease: a scan left open (a TTL cleanup cursor)
        # holds no database open. Each chunk sees the data as of its read.
        lower = self._layout.scan_prefix(table, key_group)
        upper = prefix_successor(lower)
        split = self._layout.splitter(table)
        while True:
            chunk = self._chunk(table, lower, upper)
            for key, value in chunk:
                yield (*split(key), value)
            if len(chunk) < _SCAN_CHUNK:
                return
            lower = chunk[-1][0] + b"\x00"  # the least key after the last one read

    @_leased
    def _chunk(self, table: str, lower: bytes, upper: bytes | None) -> list[tuple[bytes, bytes]]:
        return list(islice(_iterate(self._families[table], lower, upper), _SCAN_CHUNK))

    @_leased_iter
    def items_from(
        self, table: str, key_group: int, primary: bytes, after: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        # One iterator seeked past ``after`` and bounded to the primary: nothing before it is read.
        prefix = self._layout.key(table, key_group, primary)
        start = prefix if after is None else prefix + after + b"\x00"  # the least key above prefix + after
        n = len(prefix)
        for key, value in _iterate(self._families[table], start, prefix_successor(prefix)):
            yield key[n:], value

    @_leased_iter
    def primaries_from(self, table: str, key_group: int, after: bytes | None) -> Iterator[bytes]:
        family, prefix = self._families[table], self._layout.scan_prefix(table, key_group)
        n, end = len(prefix), prefix_successor(prefix)
        start = prefix if after is None else prefix + after + b"\x00"
        if not self._nested.get(table, False):
            for key, _value in _iterate(family, start, end):
                yield key[n:]
            return
        # A map is one primary over many keys: take its primary, then seek past all of its
        # entries (primaries are self-delimiting, so they are exactly the keys it prefixes).
        if after is not None:
            start = prefix_successor(prefix + after) or start
        it = _bounded(family, start, end)
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
        if table not in self._nested:  # opening a job "creates" its tables: no write, also when degraded
            self._create_table(table, nested)

    @_writing
    def _create_table(self, table: str, nested: bool) -> None:
        if table in self._nested:
            return
        # A column family without its table row (made with the database, or by a crash between
        # the two writes) is taken as it is.
        if column_family(table) not in self._column_families:
            self._db.create_column_family(column_family(table), self._options)
            self._column_families.add(column_family(table))
        self._db.put(_NESTED_PREFIX + table.encode(), b"1" if nested else b"0")
        self._nested[table] = nested
        self._open_family(table)

    @_freeing
    def drop_table(self, table: str) -> None:
        if table not in self._nested or table == META_TABLE:
            return
        del self._nested[table]
        self._families.pop(table, None)
        self._handles.pop(table, None)
        gc.collect()
        self._db.delete(_NESTED_PREFIX + table.encode())
        self._db.drop_column_family(column_family(table))
        self._column_families.discard(column_family(table))

    @_writing
    def write(self, ops: list[WriteOp]) -> None:
        batch = WriteBatch(raw_mode=True)
        self._add_ops(batch, ops)
        self._db.write(batch)

    @_writing
    def write_changes(self, flat: Mapping[str, FlatChanges], ops: list[WriteOp]) -> None:
        batch = WriteBatch(raw_mode=True)
        for table, changes in flat.items():
            handle = self._handles[table]
            if table == META_TABLE:
                for (kg, primary), value in changes.items():
                    key = self._layout.key(table, kg, primary)
                    batch.put(key, value, handle) if value is not None else batch.delete(key, handle)
                continue
            prefix, put, delete = self._layout.prefixes, batch.put, batch.delete
            rows = _put_rows(changes)
            if rows is not None:
                # Puts only (a columnar request's rows in order, or a big one's stably in key-group
                # order: a later row of a key written later and winning; or a dict of changes): the
                # keys and the batch's puts in C loops, no Python step per row.
                key_groups, primaries, records = rows
                keys = map(operator.add, map(prefix.__getitem__, key_groups), primaries)
                deque(map(put, keys, records, repeat(handle)), maxlen=0)
                continue
            for (kg, primary), value in changes.items():
                if value is None:
                    delete(prefix[kg] + primary, handle)
                else:
                    put(prefix[kg] + primary, value, handle)
        self._add_ops(batch, ops)
        self._db.write(batch)

    @_freeing
    def drop_key_groups(self, tables: Sequence[str], ranges: Sequence[KeyGroupRange]) -> None:
        # Keys start with their key group (KeyLayout), so a range of key groups is one byte range
        # of each column family: one range tombstone each, in one atomic batch, nothing read.
        batch = WriteBatch(raw_mode=True)
        bounds = self._key_group_bounds(ranges)
        for table in tables:
            handle = self._handles[table]
            for begin, end in bounds:
                batch.delete_range(begin, end, handle)
        self._db.write(batch)

    def reclaim_key_groups(self, tables: Sequence[str], ranges: Sequence[KeyGroupRange]) -> None:
        # A range tombstone hides the data but the table files keep it until a compaction reaches
        # them, which nothing may trigger: the disk, and every later incremental checkpoint's
        # files (what the next rescale downloads), would carry it. Compacting just those ranges
        # rewrites the files they touch (~1 s per million entries), while writes go on.
        self.compact_key_groups(tables, ranges)

    @_leased
    def compact_key_groups(
        self, tables: Sequence[str], ranges: Sequence[KeyGroupRange], file_bytes: int | None = None
    ) -> None:
        """Compact these key groups of these tables (RocksDB rewrites every table file that holds
        any of them, level 0's included, down the levels), while writes go on. ``file_bytes``: cut
        the files it writes at about that size instead of the table's target, so each holds a
        narrow run of key groups."""
        options = CompactOptions()
        if file_bytes is not None:
            # Rewrite files already at the last level too: a lone file RocksDB would otherwise
            # move down whole (a trivial move) keeps spanning what it spanned.
            options.set_bottommost_level_compaction(BottommostLevelCompaction.force_optimized())
        for table in tables:
            family = self._families.get(table)
            if family is None:
                continue
            if file_bytes is not None:
                family.set_options({"target_file_size_base": str(file_bytes)})
            try:
                for begin, end in self._key_group_bounds(ranges):
                    family.compact_range(begin, end, options)
            finally:
                if file_bytes is not None:
                    family.set_options({"target_file_size_base": str(_TARGET_FILE_BYTES)})

    def _key_group_bounds(self, ranges: Sequence[KeyGroupRange]) -> list[tuple[bytes, bytes]]:
        """Each range of key groups as the byte range [begin, end) its keys fill."""
        width = self._layout.prefix_width
        bounds = []
        for r in ranges:
            end = prefix_successor(r.end.to_bytes(width, "big"))
            assert end is not None  # a key group's prefix is below 0x80..: never all 0xff
            bounds.append((r.start.to_bytes(width, "big"), end))
        return bounds

    def _add_ops(self, batch: WriteBatch, ops: list[WriteOp]) -> None:
        for op in ops:
            handle = self._handles[op.table]
            if op.kind == "put":
                batch.put(self._layout.key(op.table, op.key_group, op.primary, op.secondary), op.value, handle)
            elif op.kind == "delete":
                batch.delete(self._layout.key(op.table, op.key_group, op.primary, op.secondary), handle)
            elif self._nested[op.table]:
                begin = self._layout.key(op.table, op.key_group, op.primary)
                end = prefix_successor(begin)
                assert end is not None  # a key starts with its key group (< 0x80): never all 0xff
                batch.delete_range(begin, end, handle)
            else:
                batch.delete(self._layout.key(op.table, op.key_group, op.primary), handle)

    # -- snapshots ---------------------------------------------------------------------

    @_leased
    def flush(self) -> None:
        # RocksDB releases the GIL while it flushes, and writes go on into new memtables;
        # the checkpoint in freeze() then only flushes what arrived meanwhile.
        for family in list(self._families.values()):
            family.flush()

    @_leased
    def freeze(self) -> RocksDBFrozenView:
        # Flushes the memtables and hard-links the SST files: milliseconds, not a copy.
        self._frozen_count += 1
        path = os.path.join(self._frozen_dir, f"{os.getpid()}-{self._frozen_count}")
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(self._frozen_dir, exist_ok=True)
        Checkpoint(self._db).create_checkpoint(path)
        return RocksDBFrozenView(path, KeyLayout(self.max_parallelism, dict(self._nested)))

    @_leased
    def file_spans(self, tables: Iterable[str]) -> dict[str, tuple[str, int, int]]:
        """Each table file of these (keyed) tables: ``(table, first key group, last key group)``
        of its smallest and largest key, as the MANIFEST records them (they bound its range
        deletions too). A key group's keys start with its prefix, so no key of another key group
        lies in a file; a bound shorter than the prefix is padded with zeros, which only widens
        the span. Read right after :meth:`freeze` (under the job's lock), these are the frozen
        checkpoint's files, less any that a compaction replaced meanwhile: those get no span, so a
        restore always reads them."""
        width = self._layout.prefix_width
        bounds = {
            int(os.path.basename(f["name"]).split(".")[0]): (f["start_key"], f["end_key"])
            for f in self._db.live_files()
        }
        owners: dict[int, list[str]] = {}
        for table in tables:
            # rocksdict's live_files() does not say a file's column family; the family's own
            # listing of its files (a debug dump, one " <number>:<size>[..." line per file) does.
            listing = self._families[table].property_value("rocksdb.sstables") or ""
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

    def close(self) -> None:
        with self._guard:
            if self._closed:
                return
            self._closed = True
            if self._is_open:
                self._close_db()
        logger.info("closed RocksDB instance %s", self.path)

    def _close_db(self) -> None:
        # RocksDB closes when its last Rdict object goes: the leases say nothing uses the
        # database, and this drops every one the partition holds. No gc.collect() (a full
        # collection per close made shutting down many jobs take tens of seconds; _open collects
        # only if a reopen finds the lock held) and no Rdict.close(), which flushes the memtables
        # first (~8 ms per job): the WAL already holds every write, and the next open replays it.
        self._is_open = False
        self._families.clear()
        self._handles.clear()
        del self._db
        if self._degraded:  # the next open tries for writing again
            self._degraded = False
            if self._volume is not None:
                self._volume.restored(self)
        if self._pool is not None:
            self._pool.discard(self)

    def reopen(self) -> None:
        """Open the database at ``path`` again after :meth:`close` (it may be another one now)."""
        started = time.monotonic()
        with self._guard:
            self._open(None)
            self._closed = False
            self._opened()
        logger.info("reopened RocksDB instance %s in %.0f ms", self.path, (time.monotonic() - started) * 1000)
        if self._pool is not None:
            self._pool.trim()
