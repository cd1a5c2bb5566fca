"""Heap partition: per table, one dict per key group, with copy-on-write freezes.

Copy-on-write follows Flink's ``CopyOnWriteStateMap`` at a coarser grain. Every
container (a key group's dict, and in nested tables each primary's dict of map entries)
records the partition version it was created at. ``freeze()`` bumps the version and
captures references to the current key-group dicts, which costs O(key groups), not
O(state). A later write to a container older than the newest live freeze copies that
container first, so frozen views never change; after all views are released nothing
is copied any more.

Seeking reads (listings that page) need keys in order without sorting a whole map per page.
A container gets an *index* of its keys on its first seeking read: a few sorted runs, which
a page bisects and merges. They are made in steps that each hold the GIL briefly (one sort of a
1M-key map in random order would hold it ~0.7 s and stall the event loop): chunks of 32,768
keys sorted one at a time, then neighbours merged pairwise up to 131,072 keys. Writes keep a
small delta beside it (keys added since, a count of keys removed) instead of re-sorting; a
read turns a grown delta into runs of its own, and rebuilds the runs when there are too many
or many keys were deleted. Runs are never changed in place, so a copy-on-write copy shares them.
"""

from __future__ import annotations

import heapq
import operator
import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import groupby, islice, repeat

from statehouse.backends.base import partition as base_partition
from statehouse.backends.base.partition import (
    Entry,
    FlatChanges,
    FrozenView,
    Guard,
    RowChanges,
    Sections,
    StorePartition,
    WriteOp,
)
from statehouse.backends.heap.changes import ChangeLog
from statehouse.backends.reserved import META_TABLE
from statehouse.protocol.keygroups import KeyGroupRange

_MISSING = object()
_KEY_GROUP, _KEY_GROUP_AND_TABLE = operator.itemgetter(0), operator.itemgetter(0, 1)
_PRIMARY, _VALUE = operator.itemgetter(2), operator.itemgetter(4)
_TABLE_ID = operator.itemgetter(0)  # of a section record (table id, primary, secondary, value)
# A run is a tuple, not a list: the cyclic GC stops tracking a tuple of bytes, where it would
# visit every key of a list on each full collection (~30 ms per million keys indexed).
Run = tuple[bytes, ...]
_RUN = 32_768  # keys sorted at once: one sort of that many (random order) holds the GIL ~15 ms
_MERGED = 131_072  # runs are merged up to this size: one merge (linear) holds it ~15 ms too


class _Container:
    __slots__ = ("added", "data", "index", "indexed", "removed", "version")

    def __init__(self, version: int, data: dict) -> None:
        self.version = version
        self.data = data
        self.index: tuple[Run, ...] | None = None  # sorted runs of the keys; None: not indexed
        self.indexed = 0  # keys in the runs
        self.added: set[bytes] = set()  # keys inserted since the runs were made (in no run)
        self.removed = 0  # keys deleted since (still in a run, skipped on reads)

    def copy(self, version: int) -> _Container:
        """A writable copy for copy-on-write: the runs are shared (never changed in place)."""
        copy = _Container(version, dict(self.data))
        if self.index is not None:
            copy.index, copy.indexed, copy.added, copy.removed = self.index, self.indexed, set(self.added), self.removed
        return copy

    # Writes through these keep the index's delta (they also work on a container not indexed);
    # they take the same arguments as the dict's, so a write loop can target either.

    def __setitem__(self, key: bytes, value: object) -> None:
        if self.index is not None and key not in self.data:
            self.added.add(key)
        self.data[key] = value

    def pop(self, key: bytes, _default: None = None) -> None:
        if self.data.pop(key, _MISSING) is not _MISSING and self.index is not None:
            if key in self.added:
                self.added.discard(key)
            else:
                self.removed += 1

    def keys_after(self, after: bytes | None) -> Iterator[bytes]:
        """The keys sorting after ``after`` (all when ``None``), in byte order: a bisect into each
        run merged with the (sorted) keys added since; O(page + delta), not O(container)."""
        streams: list[Iterable[bytes]] = [_tail(run, after) for run in self._folded()]
        if self.added:
            streams.append(sorted(key for key in self.added if after is None or key > after))
        if not self.removed:  # nothing deleted since the runs were made: each key is live, in one run
            return iter(streams[0]) if len(streams) == 1 else heapq.merge(*streams)
        data = self.data
        if len(streams) <= 1:  # one run holds a key once
            return (key for stream in streams for key in stream if key in data)
        return _unique(key for key in heapq.merge(*streams) if key in data)

    def _folded(self) -> tuple[Run, ...]:
        """The runs, made on the first seeking read and remade when the delta has grown: the
        keys added become runs of their own; many runs, or many deleted keys, rebuild them all.
        Every sort is of one run, so no single step holds the GIL long, whatever the size."""
        runs, size = self.index, self.indexed
        if runs is not None and self.removed <= max(1024, size // 4) and len(runs) <= size // _MERGED + 16:
            if len(self.added) <= max(1024, size // 64):
                return runs
            runs = runs + _sorted_runs(iter(self.added))
            self.index, self.indexed, self.added = runs, size + len(self.added), set()
            return runs
        runs = _sorted_runs(iter(self.data))
        self.index, self.indexed, self.added, self.removed = runs, len(self.data), set(), 0
        return runs


def _sorted_runs(keys: Iterator[bytes]) -> tuple[Run, ...]:
    """``keys`` sorted in runs: chunks of ``_RUN`` sorted, and neighbours of equal size merged (a
    binary counter) up to ``_MERGED``, so that a read merges a few runs, not dozens."""
    runs: list[Run] = []
    while chunk := list(islice(keys, _RUN)):
        chunk.sort()
        runs.append(tuple(chunk))
        while len(runs) > 1 and len(runs[-2]) == len(runs[-1]) and 2 * len(runs[-1]) <= _MERGED:
            last = runs.pop()
            runs.append(tuple(sorted(runs.pop() + last)))  # two sorted runs: one linear merge
    return tuple(runs)


def _tail(run: Run, after: bytes | None) -> Iterator[bytes]:
    """The keys of a sorted run after ``after``, lazily (no copy of the run)."""
    start = 0 if after is None else bisect_right(run, after)
    return map(run.__getitem__, range(start, len(run)))


def _unique(keys: Iterator[bytes]) -> Iterator[bytes]:
    """Drop repeats from sorted keys (a key deleted and inserted again is in two runs)."""
    last = None
    for key in keys:
        if key != last:
            yield key
            last = key


class _Table:
    __slots__ = ("groups", "nested")

    def __init__(self, nested: bool) -> None:
        self.nested = nested
        self.groups: dict[int, _Container] = {}


def _sorted_entries(nested: bool, group: dict) -> Iterator[tuple[bytes, bytes, bytes]]:
    """``(primary, secondary, value)`` in byte order over a dict nobody mutates (a flat one's in C loops)."""
    if not nested:
        primaries = sorted(group)
        return zip(primaries, repeat(b""), map(group.__getitem__, primaries))
    return _sorted_nested_entries(group)


def _sorted_nested_entries(group: dict) -> Iterator[tuple[bytes, bytes, bytes]]:
    for primary in sorted(group):
        entries = group[primary].data
        for secondary in sorted(entries):
            yield primary, secondary, entries[secondary]


class HeapFrozenView(FrozenView):
    """A heap partition frozen for a snapshot: references to the key-group dicts as of the freeze,
    which later writes copy before changing; releasing it lets the partition stop copying."""

    def __init__(self, partition: HeapPartition, version: int, captured: dict[str, tuple[bool, dict[int, dict]]]):
        self._partition = partition
        self._version = version
        self._captured = captured
        self._released = False

    def tables(self) -> dict[str, bool]:
        return {name: nested for name, (nested, _groups) in self._captured.items()}

    def scan(self, table: str, key_group: int) -> Iterator[tuple[bytes, bytes, bytes]]:
        nested, groups = self._captured[table]
        group = groups.get(key_group)
        return _sorted_entries(nested, group) if group else iter(())

    def values(self, table: str, key_group: int, primaries: Sequence[bytes]) -> list[bytes | None]:
        """A flat table's value of each primary as frozen (``None``: none)."""
        group = self._captured[table][1].get(key_group)
        return [None] * len(primaries) if group is None else list(map(group.get, primaries))

    def entries(self, table: str, key_group: int, primary: bytes) -> list[tuple[bytes, bytes]]:
        """A nested table's ``(secondary, value)`` entries of one primary as frozen, in byte order."""
        group = self._captured[table][1].get(key_group)
        found = None if group is None else group.get(primary)
        return [] if found is None else sorted(found.data.items())

    def key_count(self) -> int:
        """How many keys (primaries) every keyed table holds together, as frozen."""
        return sum(
            len(group)
            for name, (_n, groups) in self._captured.items()
            if name != META_TABLE
            for group in groups.values()
        )

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._partition._release(self._version)


class HeapPartition(StorePartition):
    """One job's state in memory (Flink's ``CopyOnWriteStateMap``, coarser): per table a dict per
    key group, each container stamped with the version it was made at, so a freeze costs
    O(key groups) and a write copies only a container a live frozen view still shares."""

    def __init__(self, max_parallelism: int, *, track_changes: bool = False) -> None:
        self.max_parallelism = max_parallelism
        self._tables: dict[str, _Table] = {META_TABLE: _Table(nested=False)}
        self._version = 0
        self._live_versions: set[int] = set()
        self._required_version = 0  # containers older than this are shared with a view
        self._lock = threading.Lock()  # guards the version bookkeeping only
        self.changes = ChangeLog() if track_changes else None
        # Key groups' containers dropped, freed by reclaim_key_groups: freeing millions of entries
        # at the drop would hold a live rescale's commit (the job's lock) for as long.
        self._dropped: list[object] = []

    # -- reads -------------------------------------------------------------------------

    def tables(self) -> dict[str, bool]:
        return {name: t.nested for name, t in self._tables.items()}

    def _group(self, table: str, key_group: int) -> dict | None:
        container = self._tables[table].groups.get(key_group)
        return container.data if container is not None else None

    def get(self, table: str, key_group: int, primary: bytes, secondary: bytes = b"") -> bytes | None:
        t = self._tables[table]
        container = t.groups.get(key_group)
        if container is None:
            return None
        if not t.nested:
            return container.data.get(primary)
        entries = container.data.get(primary)
        return entries.data.get(secondary) if entries is not None else None

    def get_many(
        self,
        table: str,
        key_groups: Sequence[int],
        primaries: Sequence[bytes],
        secondaries: Sequence[bytes] | None = None,
        budget: int | None = None,  # values are not copied: every row is read
    ) -> list[bytes | None]:
        t = self._tables[table]
        containers, empty = t.groups, _Container(0, {})
        if not t.nested:
            if len(key_groups) != len(primaries):
                raise ValueError(f"{len(key_groups)} key groups for {len(primaries)} primaries")
            # Each row's dict, then its value: two C loops, no Python step per row.
            found = {kg: c.data for kg in set(key_groups) if (c := containers.get(kg)) is not None}
            return list(map(dict.get, map(found.get, key_groups, repeat(empty.data)), primaries))
        assert secondaries is not None
        return [
            containers.get(kg, empty).data.get(p, empty).data.get(s)
            for kg, p, s in zip(key_groups, primaries, secondaries, strict=True)
        ]

    def items(self, table: str, key_group: int, primary: bytes) -> Iterator[tuple[bytes, bytes]]:
        t = self._tables[table]
        container = t.groups.get(key_group)
        if container is None:
            return iter(())
        if not t.nested:
            value = container.data.get(primary)
            return iter(() if value is None else ((b"", value),))
        entries = container.data.get(primary)
        return iter(sorted(entries.data.items())) if entries is not None else iter(())

    def scan(self, table: str, key_group: int) -> Iterator[tuple[bytes, bytes, bytes]]:
        t = self._tables[table]
        container = t.groups.get(key_group)
        if container is None:
            return iter(())
        # Materialize the sorted list now, so later writes cannot disturb the iteration.
        return iter(list(_sorted_entries(t.nested, container.data)))

    def items_from(
        self, table: str, key_group: int, primary: bytes, after: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        t = self._tables[table]
        container = t.groups.get(key_group)
        if container is None:
            return iter(())
        if not t.nested:
            value = container.data.get(primary)
            return iter(() if value is None or after is not None else ((b"", value),))
        entries = container.data.get(primary)
        if entries is None:
            return iter(())
        data = entries.data
        return ((secondary, data[secondary]) for secondary in entries.keys_after(after))

    def primaries_from(self, table: str, key_group: int, after: bytes | None) -> Iterator[bytes]:
        container = self._tables[table].groups.get(key_group)
        return iter(()) if container is None else container.keys_after(after)

    def entries_from(self, table: str, key_group: int, after: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        t = self._tables[table]
        if t.nested:
            raise ValueError(f"entries_from reads flat tables; {table!r} is nested")
        container = t.groups.get(key_group)
        if container is None:
            return iter(())
        data = container.data
        return ((primary, data[primary]) for primary in container.keys_after(after))

    # -- writes ------------------------------------------------------------------------

    def create_table(self, table: str, nested: bool) -> None:
        if table not in self._tables:
            self._tables[table] = _Table(nested)

    def drop_table(self, table: str) -> None:
        if table in self._tables and self.changes is not None:
            self.changes.lose(f"table {table!r} dropped")
        self._tables.pop(table, None)

    def _writable(self, container: _Container | None) -> _Container:
        if container is None:
            return _Container(self._version, {})
        if container.version < self._required_version:
            return container.copy(self._version)
        return container

    def _check_tables(self, tables: Iterator[str]) -> None:
        # Validate every table first so a batch is applied whole or not at all.
        for table in tables:
            if table not in self._tables:
                raise KeyError(f"no table {table!r}")

    def drop_key_groups(self, tables: Sequence[str], ranges: Sequence[KeyGroupRange]) -> None:
        # A frozen view holds its own references to the dicts: dropping them here leaves it whole.
        if self.changes is not None:
            self.changes.note_whole(kg for r in ranges for kg in r)
        for table in tables:
            groups = self._tables[table].groups
            for r in ranges:
                for kg in r:
                    container = groups.pop(kg, None)
                    if container is not None:
                        self._dropped.append(container)

    def reclaim_key_groups(self, tables: Sequence[str], ranges: Sequence[KeyGroupRange]) -> None:
        # One key group's container at a time: the event loop gets the GIL between them.
        while self._dropped:
            self._dropped.pop()

    def write(self, ops: list[WriteOp]) -> None:
        self._check_tables(op.table for op in ops)
        self._apply(ops)

    def load_entries(self, entries: Iterable[Entry], directory: str, guard: Guard) -> int:
        """Each run of one table's entries of one key group goes into its dict at once (a flat
        table's in one C-level update), ``LOAD_BATCH`` entries per ``guard()``."""
        loaded = 0
        source = iter(entries)
        while batch := list(islice(source, base_partition.LOAD_BATCH)):
            self._check_tables(iter({table for _kg, table, _p, _s, _v in batch}))
            with guard():
                if self.changes is not None:  # into key groups that held nothing: each is new whole
                    self.changes.note_whole(set(map(_KEY_GROUP, batch)))
                for (kg, table), run in groupby(batch, key=_KEY_GROUP_AND_TABLE):
                    self._load_run(table, kg, list(run))
            loaded += len(batch)
        return loaded

    def load_sections(self, tables: Sequence[str], sections: Sections, directory: str, guard: Guard) -> int:
        """A section at a time, each table's run of it into its dict at once: a flat table's
        primaries and values as two columns, one C-level update, no Python step per entry."""
        loaded = 0
        for kg, records in sections:
            if not records:
                continue
            runs = [(tables[table_id], list(run)) for table_id, run in groupby(records, key=_TABLE_ID)]
            self._check_tables(table for table, _run in runs)
            with guard():
                if self.changes is not None:  # into key groups that held nothing: each is new whole
                    self.changes.note_whole((kg,))
                for table, run in runs:
                    if self._tables[table].nested:
                        self._load_run(table, kg, [(kg, table, r[1], r[2], r[3]) for r in run])
                    else:
                        _ids, primaries, _secondaries, values = zip(*run, strict=True)
                        self._load_flat(table, kg, primaries, values)
            loaded += len(records)
        return loaded

    def _load_flat(self, table: str, kg: int, primaries: Iterable[bytes], values: Iterable[bytes]) -> None:
        """A flat table's run of one key group into its dict at once (one C-level update; an
        indexed container, which tracks its key set, a key at a time)."""
        groups = self._tables[table].groups
        container = groups[kg] = self._writable(groups.get(kg))
        if container.index is None:
            container.data.update(zip(primaries, values, strict=True))
            return
        for primary, value in zip(primaries, values, strict=True):
            container[primary] = value

    def _load_run(self, table: str, kg: int, run: list[Entry]) -> None:
        t = self._tables[table]
        if not t.nested:
            self._load_flat(table, kg, map(_PRIMARY, run), map(_VALUE, run))
            return
        container = t.groups[kg] = self._writable(t.groups.get(kg))
        keys: dict | _Container = container.data if container.index is None else container
        for primary, entries in groupby(run, key=_PRIMARY):
            found = container.data.get(primary)
            writable = self._writable(found)
            if writable is not found:
                keys[primary] = writable
            target: dict | _Container = writable.data if writable.index is None else writable
            for _kg, _table, _primary, secondary, value in entries:
                target[secondary] = value

    def write_changes(self, flat: Mapping[str, FlatChanges], ops: list[WriteOp]) -> None:
        self._check_tables(iter(flat))
        self._check_tables(op.table for op in ops)
        if self.changes is not None:
            self.changes.note_flat(flat)
        for table, changes in flat.items():
            groups = self._tables[table].groups
            writable: dict[int, dict | _Container] = {}  # key group -> where to write, made writable once
            if isinstance(changes, RowChanges) and not changes.deletes:
                # A columnar put's rows, in order (a later row of a key wins): each key group
                # made writable once, then the writes in a C loop, no Python step per row.
                for kg in set(changes.key_groups):
                    made = groups[kg] = self._writable(groups.get(kg))
                    writable[kg] = made.data if made.index is None else made
                targets = map(writable.__getitem__, changes.key_groups)
                deque(map(operator.setitem, targets, changes.primaries, changes.records), maxlen=0)  # type: ignore[arg-type]
                continue
            for (kg, primary), value in changes.items():
                data = writable.get(kg)
                if data is None:
                    container = groups.get(kg)
                    if value is None and container is None:
                        continue
                    container = groups[kg] = self._writable(container)
                    # An indexed container (one a listing has read) tracks its key set; the
                    # common case stays a plain dict write.
                    data = writable[kg] = container.data if container.index is None else container
                if value is None:
                    data.pop(primary, None)
                else:
                    data[primary] = value
        self._apply(ops)

    def _apply(self, ops: list[WriteOp]) -> None:
        if self.changes is not None:
            self.changes.note_ops(ops)
        for op in ops:
            t = self._tables[op.table]
            group = t.groups.get(op.key_group)
            if op.kind != "put" and group is None:
                continue
            group = self._writable(group)
            t.groups[op.key_group] = group
            data = group.data
            keys: dict | _Container = data if group.index is None else group  # indexed: track the key set
            if not t.nested or op.kind == "clear":
                if op.kind == "put":
                    keys[op.primary] = op.value
                else:
                    keys.pop(op.primary, None)
                continue
            entries = data.get(op.primary)
            if op.kind == "delete" and entries is None:
                continue
            writable = self._writable(entries)
            if writable is not entries:  # a new map, or a copy of a frozen one
                keys[op.primary] = writable
            target: dict | _Container = writable.data if writable.index is None else writable
            if op.kind == "put":
                target[op.secondary] = op.value
            else:
                target.pop(op.secondary, None)
                if not writable.data:
                    keys.pop(op.primary, None)

    # -- snapshots ---------------------------------------------------------------------

    def freeze(self) -> HeapFrozenView:
        with self._lock:
            self._version += 1
            version = self._version
            self._live_versions.add(version)
            self._required_version = version
        captured = {name: (t.nested, {kg: c.data for kg, c in t.groups.items()}) for name, t in self._tables.items()}
        return HeapFrozenView(self, version, captured)

    def _release(self, version: int) -> None:
        with self._lock:
            self._live_versions.discard(version)
            self._required_version = max(self._live_versions, default=0)

    def close(self) -> None:
        self._tables.clear()
        self._dropped.clear()
        if self.changes is not None:
            self.changes.lose("closed")
