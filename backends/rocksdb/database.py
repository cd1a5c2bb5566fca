"""What a job's RocksDB database is, apart from the partition serving it: its options, how a
table's keys map to RocksDB keys (:class:`KeyLayout`), a read-only frozen view of it
(:class:`RocksDBFrozenView`), bounded iteration, and the repairs an open after a full volume or
a partial download needs.

Layout (Flink's ``RocksDBKeyedStateBackend``): one column family per table; a RocksDB key
is ``key-group prefix + primary + secondary``, the prefix big-endian in 1 byte when max
parallelism ≤ 128 and 2 bytes otherwise, so every key group — and every range of key
groups — is one contiguous byte range. Job metadata lives in the default column family.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rocksdict import AccessType, BlockBasedOptions, Cache, DBCompressionType, Options, Rdict, ReadOptions

from statehouse.backends.base.partition import FrozenView
from statehouse.backends.reserved import META_TABLE
from statehouse.snapshots.stored.codec import split_nested_key
from statehouse.snapshots.stored.keys import column_family, key_group_prefix_width, prefix_successor

# Table files one instance keeps open (RocksDB's default, -1, keeps every SST file open): with
# the open-instance bound, this bounds a replica's file descriptors.
MAX_OPEN_FILES = 64
# A job's write-ahead logs without a data volume's reserve to fit in (staged restores, readers).
DEFAULT_WAL_LIMIT = 64 << 20
# Rows of the default column family beside the metadata table's: each table's "nested" flag (a
# map's table); the max parallelism the database was created with is under MAX_PARALLELISM_KEY.
NESTED_PREFIX = b"table-nested:"
META_PREFIX = b"meta:"


# RocksDB's compression algorithms by the names a setting gives them (Flink's
# ``compression.per.level`` names them LZ4_COMPRESSION, NO_COMPRESSION, ...).
Compression = Literal["lz4", "zstd", "snappy", "none"]
COMPRESSIONS: dict[Compression, Callable[[], DBCompressionType]] = {
    "lz4": DBCompressionType.lz4,
    "zstd": DBCompressionType.zstd,
    "snappy": DBCompressionType.snappy,
    "none": DBCompressionType.none,
}


@dataclass(frozen=True)
class TableFiles:
    """How a job's database writes its table files: their size and the base level's (RocksDB's
    ``target_file_size_base`` and ``max_bytes_for_level_base``; Flink's
    ``compaction.level.target-file-size-base`` and ``max-size-level-base``), levels sized from the
    last one up (``level_compaction_dynamic_level_bytes``), and how their blocks are compressed.

    Why not RocksDB's sizes (64 MiB files, a 256 MiB base level): every checkpoint flushes a
    level-0 file spanning every key group the batch wrote, and every fourth one compacts level 0
    into the base level, rewriting each file there that overlaps it, which the next incremental
    checkpoint uploads again. A state under 256 MiB is then one level of large files, all of it
    rewritten: a micro-batch's checkpoint uploads the whole table every fourth batch. A small
    base level over levels of small files rewrites a narrow part, and its files are narrow in key
    groups (a move reads and drops about its share). Measured (bench/RESULTS.md §19l): 0.38x the
    bytes per micro-batch at 1,000,000 keys, 0.66x at 10,000,000 with the largest upload 24 MB
    instead of 100; point reads unchanged at both sizes.

    LZ4, not RocksDB's default Snappy: a state larger than the block cache reads its blocks from
    the files, each read decompressing one, and LZ4 decompresses faster at about the same size
    (RocksDB's tuning guide says so too). ``zstd`` makes the files and checkpoints about a third
    smaller for about a quarter more CPU per staged row, and ``none`` was no faster (bench/RESULTS.md
    §20). Files written another way stay readable: a change applies to the files written from then on."""

    target_file_bytes: int = 2 << 20
    level_base_bytes: int = 4 << 20
    compression: Compression = "lz4"

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}; got {self.compression!r}")

    def apply(self, options: Options) -> None:
        options.set_level_compaction_dynamic_level_bytes(True)
        options.set_target_file_size_base(self.target_file_bytes)
        options.set_max_bytes_for_level_base(self.level_base_bytes)
        options.set_compression_type(COMPRESSIONS[self.compression]())


def db_options(
    max_wal_bytes: int = DEFAULT_WAL_LIMIT, block_cache: Cache | None = None, files: TableFiles | None = None
) -> Options:
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
    (files or TableFiles()).apply(options)
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


def _bounds(lower: bytes, upper: bytes | None) -> ReadOptions:
    """Read options that keep an iterator inside [lower, upper) (``None``: to the end)."""
    read_options = ReadOptions()
    read_options.set_iterate_lower_bound(lower)
    if upper is not None:
        read_options.set_iterate_upper_bound(upper)
    return read_options


def bounded(source: Any, lower: bytes, upper: bytes | None) -> Any:
    """A RocksDB iterator over [lower, upper) (``None``: to the end), seeked to ``lower``."""
    it = source.iter(_bounds(lower, upper))
    it.seek(lower)
    return it


def iterate(source: Any, lower: bytes, upper: bytes | None) -> Iterator[tuple[bytes, bytes]]:
    """The (key, value) entries of a database or column family in [lower, upper), in order:
    rocksdict's own item iterator, which steps in Rust (a third of the cost of stepping from Python)."""
    items = source.items(from_key=lower, read_opt=_bounds(lower, upper))
    yield from items
    del items


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
            return META_PREFIX + primary
        return key_group.to_bytes(self.prefix_width, "big") + primary + secondary

    def scan_prefix(self, table: str, key_group: int) -> bytes:
        """The prefix every key of one key group of a table starts with."""
        return META_PREFIX if table == META_TABLE else key_group.to_bytes(self.prefix_width, "big")

    def splitter(self, table: str) -> Callable[[bytes], tuple[bytes, bytes]]:
        """How to cut a stored key of ``table`` back into (primary, secondary)."""
        prefix_len = len(self.scan_prefix(table, 0))
        if table == META_TABLE or not self.nested.get(table, False):
            return lambda key: (key[prefix_len:], b"")
        return lambda key: split_nested_key(key, prefix_len)

    def scan(self, family: Rdict, table: str, key_group: int) -> Iterator[tuple[bytes, bytes, bytes]]:
        lower = self.scan_prefix(table, key_group)
        split = self.splitter(table)
        for key, value in iterate(family, lower, prefix_successor(lower)):
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

    def release(self) -> None:
        # No gc.collect() here: a read-only instance holds no lock that a reopen would wait
        # for, and a full collection stalls the request-serving thread for tens of ms.
        self._families.clear()
        if self._db is not None:
            self._db.close()
            self._db = None
        shutil.rmtree(self.path, ignore_errors=True)
