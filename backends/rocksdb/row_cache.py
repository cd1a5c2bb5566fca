"""A replica's cache of the rows that point reads of flat tables found, in front of RocksDB: Kafka
Streams' record cache (``statestore.cache.max.bytes``), for reads.

A point read through rocksdict costs 1.5-2.6 µs even when RocksDB has the key's block cached (the
call into RocksDB, the key's searches through the memtables, the files' filters and the block's
index; bench/RESULTS.md §24), a dict lookup a tenth of that. A micro-batch job reads again the keys
it touched in earlier micro-batches: at 10,000 users, every key of every micro-batch.

Rows are cached as RocksDB stores them (the record bytes, or ``None`` for a key that has none), so
a read answers exactly what RocksDB would: TTL and every state's decoding apply to it unchanged.

**Coherent.** A read fills what it read from RocksDB, unless a write of the partition came between
its start and its end, so a value read before a write is never cached after it. Every write of a
flat table whose rows are cached (:meth:`PartitionRows.written`) goes into the cache once RocksDB
has taken it, in place of any row cached under its keys. Any other change of a
partition's data (ingested files, range deletes, a dropped table, a restore's swap, a close) drops
the partition's rows (:meth:`PartitionRows.invalidate`).

**Bounded.** Two generations of at most half the budget each, over every table of every job:
reads and writes fill the young one, a hit in the old one moves to the young one, and when the young one is
full it becomes the old one (the old one's rows are dropped). A row counts its key and value bytes
and a fixed share for the Python objects and the dict's slot; a read or write of more rows than a
generation holds is not cached.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from itertools import compress, repeat
from operator import is_

logger = logging.getLogger(__name__)

# Python's share of a cached row beyond its key and value bytes: two bytes objects' headers (33
# each) and the dict's slot and index (about 50 at its usual fill).
ENTRY_OVERHEAD = 120
DEFAULT_MAX_BYTES = 64 << 20
# A table's reads are judged by their hits every WINDOW_ROWS rows read: under MIN_HIT_RATIO, the
# cache costs it more than it saves (a miss costs a lookup, a fill and the write after it; measured,
# bench/RESULTS.md §24: a million-user job on a 64 MiB cache read 5-15% of its rows from it, and
# spent 19% more CPU), so the table reads past the cache for BYPASS_ROWS rows, twice as many after
# each judgement that finds the same, then tries again. The first window after a start (or a
# bypass) is the cache warming up, not judged.
WINDOW_ROWS = 50_000
MIN_HIT_RATIO = 0.25
BYPASS_ROWS = 2_000_000
MAX_BYPASS_ROWS = 64_000_000
_MISS = object()  # what a lookup answers for a key the cache does not hold


def _size(keys: Sequence[bytes], values: Sequence[bytes | None]) -> int:
    return sum(map(len, keys)) + sum(map(len, filter(None, values))) + ENTRY_OVERHEAD * len(keys)


class _TableRows:
    """One table's cached rows (one partition's), in the two generations."""

    __slots__ = (
        "__weakref__",
        "bypass_left",
        "bypass_next",
        "hits",
        "old",
        "old_bytes",
        "read",
        "warm",
        "young",
        "young_bytes",
    )

    def __init__(self) -> None:
        self.young: dict[bytes, bytes | None] = {}
        self.old: dict[bytes, bytes | None] = {}
        self.young_bytes = self.old_bytes = 0
        self.read = self.hits = 0  # rows looked up, and found, in this window
        self.warm = False
        self.bypass_left = 0  # rows still to be read past the cache
        self.bypass_next = BYPASS_ROWS


class RowCache:
    """The rows of every job's flat tables on a replica, ``max_bytes`` at most. Lookups of the
    young generation take no lock (a dict's lookups are atomic); every change takes :attr:`lock`."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive; got {max_bytes}")
        self.max_bytes = max_bytes
        self.lock = threading.Lock()
        self._tables: weakref.WeakSet[_TableRows] = weakref.WeakSet()
        self._young_bytes = self._old_bytes = 0

    @property
    def size(self) -> int:
        """The bytes counted for the rows held now."""
        return self._young_bytes + self._old_bytes

    def __len__(self) -> int:
        return sum(len(t.young) + len(t.old) for t in list(self._tables))

    def _new_table(self) -> _TableRows:
        rows = _TableRows()
        with self.lock:
            self._tables.add(rows)
        return rows

    def _drop(self, tables: Sequence[_TableRows], forget: bool = True) -> None:
        """Drop these tables' rows, and (``forget``) the tables (the caller holds the lock)."""
        for rows in tables:
            if forget:
                self._tables.discard(rows)
            self._young_bytes -= rows.young_bytes
            self._old_bytes -= rows.old_bytes
            rows.young, rows.old, rows.young_bytes, rows.old_bytes = {}, {}, 0, 0

    def _fill(self, rows: _TableRows, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """Hold rows read from RocksDB, not held yet (the caller holds the lock)."""
        size = _size(keys, values)
        if size <= self.max_bytes // 2:
            self._hold(rows, keys, values, size)

    def _hold(self, rows: _TableRows, keys: Sequence[bytes], values: Sequence[bytes | None], size: int) -> None:
        """Put rows of ``size`` bytes into the young generation, turning the generations over first
        if it has no room for them (the caller holds the lock)."""
        if self._young_bytes + size > self.max_bytes // 2:
            self._rotate()
        rows.young.update(zip(keys, values, strict=True))
        rows.young_bytes += size
        self._young_bytes += size

    def _rotate(self) -> None:
        for rows in list(self._tables):
            rows.old, rows.old_bytes = rows.young, rows.young_bytes
            rows.young, rows.young_bytes = {}, 0
        self._old_bytes, self._young_bytes = self._young_bytes, 0

    def _write(self, rows: _TableRows, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """A write's rows, a later one of a key winning, held in place of any cached (the caller
        holds the lock). A replaced row's bytes stay counted until its generation goes: the count
        only ever errs high."""
        size = _size(keys, values)
        if size > self.max_bytes // 2:  # more than a generation holds: the keys are dropped instead
            for held in (rows.young, rows.old):
                deque(map(held.pop, keys, repeat(None)), maxlen=0)
            return
        self._hold(rows, keys, values, size)
        if rows.old:  # the rows they replace there (after a turn-over, the young ones' were)
            deque(map(rows.old.pop, keys, repeat(None)), maxlen=0)

    def _lookup(self, rows: _TableRows, keys: list[bytes]) -> list[object]:
        """The cached values of ``keys``, ``_MISS`` where none is; hits in the old generation move
        to the young one."""
        found: list[object] = list(map(rows.young.get, keys, repeat(_MISS)))
        if rows.old and found.count(_MISS):
            with self.lock:  # a write replaces rows under it too
                old = rows.old
                in_old = list(map(old.get, keys, repeat(_MISS)))  # in C; most keys are in neither
                moved = []
                if in_old.count(_MISS) < len(keys):
                    moved = [(i, value) for i, value in enumerate(in_old) if value is not _MISS and found[i] is _MISS]
                if moved:
                    # Once each: a read may name a key twice (two rows of it in one request).
                    taken: dict[bytes, bytes | None] = {keys[i]: value for i, value in moved}  # type: ignore[misc]
                    for key in taken:
                        del old[key]
                    moved_keys, moved_values = list(taken), list(taken.values())
                    size = _size(moved_keys, moved_values)
                    rows.old_bytes -= size
                    self._old_bytes -= size
                    for i, value in moved:
                        found[i] = value
                    self._fill(rows, moved_keys, moved_values)
        return found


class PartitionRows:
    """One partition's part of the replica's :class:`RowCache`: its tables' rows, and a count of
    its writes that keeps a read from caching what a write replaced meanwhile."""

    def __init__(self, cache: RowCache) -> None:
        self._cache = cache
        self._tables: dict[str, _TableRows] = {}
        self._writes = 0

    def read(
        self,
        table: str,
        keys: list[bytes],
        read: Callable[[list[bytes]], list[bytes | None]],
        budget: int | None = None,
    ) -> list[bytes | None]:
        """The values of ``keys`` of ``table``: the cached ones, and the others by ``read`` (one
        call for all of them), which are cached then unless a write came meanwhile. ``budget``:
        the values up to the first that passes so many bytes, the others read one by one."""
        cache = self._cache
        writes = self._writes
        rows = self._tables.get(table)
        if rows is None:
            rows = self._tables.setdefault(table, cache._new_table())
        if rows.bypass_left > 0:
            rows.bypass_left -= len(keys)
            return read(keys)
        found = cache._lookup(rows, keys)
        misses = found.count(_MISS)
        rows.read += len(keys)
        rows.hits += len(keys) - misses
        if rows.read >= WINDOW_ROWS:
            self._judge(rows)
        if budget is not None:
            return self._bounded(table, rows, writes, keys, found, read, budget)
        if not misses:
            return found  # type: ignore[return-value]
        if misses == len(keys):
            fill_keys = keys
            values = read(keys)
            found = values  # type: ignore[assignment]
        else:
            missing = list(compress(range(len(found)), map(is_, found, repeat(_MISS))))
            fill_keys = [keys[i] for i in missing]
            values = read(fill_keys)
            for i, value in zip(missing, values, strict=True):
                found[i] = value
        self._fill_unless_written(table, rows, writes, fill_keys, values)
        return found  # type: ignore[return-value]

    def _fill_unless_written(
        self, table: str, rows: _TableRows, writes: int, keys: list[bytes], values: list[bytes | None]
    ) -> None:
        """Cache what a read that began at write count ``writes`` found, unless a write of the
        partition, or its invalidation, came since."""
        with self._cache.lock:
            if self._writes == writes and self._tables.get(table) is rows:
                self._cache._fill(rows, keys, values)

    def _bounded(
        self,
        table: str,
        rows: _TableRows,
        writes: int,
        keys: list[bytes],
        found: list[object],
        read: Callable[[list[bytes]], list[bytes | None]],
        budget: int,
    ) -> list[bytes | None]:
        values: list[bytes | None] = []
        fill_keys: list[bytes] = []
        fill_values: list[bytes | None] = []
        for key, value in zip(keys, found, strict=True):
            if value is _MISS:
                value = read([key])[0]
                fill_keys.append(key)
                fill_values.append(value)
            values.append(value)  # type: ignore[arg-type]
            if value is not None:
                budget -= len(value)  # type: ignore[arg-type]
                if budget < 0:
                    break
        if fill_keys:
            self._fill_unless_written(table, rows, writes, fill_keys, fill_values)
        return values

    def _judge(self, rows: _TableRows) -> None:
        """At the end of a window: whether the table's reads go on through the cache."""
        ratio = rows.hits / rows.read
        rows.read = rows.hits = 0
        if not rows.warm:
            rows.warm = True
            return
        if ratio >= MIN_HIT_RATIO:
            rows.bypass_next = BYPASS_ROWS
            return
        cache = self._cache
        with cache.lock:  # no read under way fills it, no write goes into it, until the bypass ends
            self._writes += 1
            cache._drop([rows], forget=False)
            rows.warm = False
            rows.bypass_left = rows.bypass_next
            rows.bypass_next = min(2 * rows.bypass_next, MAX_BYPASS_ROWS)
        logger.debug(
            "row cache: %.0f%% of a table's rows found; read past it for %d rows", 100 * ratio, rows.bypass_left
        )

    def written(self, tables: dict[str, tuple[list[bytes], list[bytes | None]]]) -> None:
        """RocksDB took these rows (per table: keys, values, ``None`` for a delete; a later one of
        a key wins); called after the write, before it is answered."""
        cache = self._cache
        with cache.lock:
            self._writes += 1
            for table, (keys, values) in tables.items():
                rows = self._tables.get(table)
                if rows is not None and rows.bypass_left <= 0:
                    cache._write(rows, keys, values)

    def invalidate(self) -> None:
        """The partition's data changed other than by :meth:`written`: none of its cached rows is used again."""
        cache = self._cache
        with cache.lock:
            self._writes += 1
            cache._drop(list(self._tables.values()))
            self._tables = {}
