"""Which keys of a heap partition changed between its checkpoints: what a changelog delta holds.

A heap checkpoint as a changelog (``statehouse.backends.heap.snapshot``) writes only the keys
that changed since the last *completed* checkpoint. The partition notes the key of every write
here, and a flat table's write its values too (the delta then takes a key's last value from
the log, not from the frozen dicts: cache misses at millions of keys); each checkpoint's freeze
*cuts* the log (under the job's lock, so every write is either before the cut and in the frozen
view, or after it and in the next segment). A checkpoint that builds on checkpoint P takes every
segment cut after P's: a failed or aborted checkpoint in between costs nothing, its keys are in
the next delta. Noting more than changed is harmless
(a delta carries each key's current content); noting less would lose a write, so a change the
log cannot follow key by key (a table dropped, a close, a restore's bulk load) *loses* it, and the
next checkpoint writes a full base; key groups dropped or loaded whole (a live rescale's) are noted
as such, and a checkpoint whose range holds one of them writes a base too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter

from statehouse.backends.base.partition import FlatChanges, RowChanges, WriteOp
from statehouse.backends.reserved import META_TABLE

log = logging.getLogger(__name__)

_KEY_GROUP = itemgetter(0)  # of a (key group, primary) key

# Past this many rows noted in all segments not yet built on, the log is lost and the next
# checkpoint writes a base: checkpoints failing for long (or taken no more) must not let memory
# grow unbounded. A row kept costs a reference, or a key tuple kept alive: ~100 bytes at most.
MAX_NOTED_ROWS = 2_000_000
# The values a write left are kept while those kept in all segments weigh less than this (a value
# a later write replaced stays alive for the log alone); past it, writes note their keys only.
MAX_NOTED_VALUE_BYTES = 256 << 20

Keys = tuple[Sequence[bytes], Sequence[int]] | list[tuple[int, bytes]]
"""One write's keys of a table: a columnar write's primaries and key groups (its own sequences,
not copied), or a dict's ``(key group, primary)`` keys."""


@dataclass(frozen=True, slots=True)
class Written:
    """One write's keys of a table, and where it kept them the values it left (``None`` for a
    key it deleted) and their bytes; ``values`` None: read them from the frozen view."""

    keys: Keys
    values: Sequence[bytes | None] | None = None
    value_bytes: int = 0


@dataclass
class Segment:
    """What was written between two cuts: per table, each write (repeats and all: merged when
    read), and the key groups replaced whole (dropped, or bulk-loaded)."""

    keys: dict[str, list[Written]] = field(default_factory=dict)
    whole: set[int] = field(default_factory=set)


@dataclass
class Changed:
    """The keys of several segments together, per table: each ``(key group, primary)`` once with
    the last value the log kept of it, and the key groups where a write kept no values (the
    frozen view holds theirs)."""

    values: dict[str, dict[tuple[int, bytes], bytes | None]]
    unread: dict[str, set[int]]


Cut = tuple[int, int]
"""Where the log was cut: ``(checkpoint id, 0)`` by a checkpoint's freeze, ``(the newest
checkpoint id cut before, 1)`` by a seed's (written between two checkpoints)."""


def checkpoint_cut(checkpoint_id: int) -> Cut:
    return (checkpoint_id, 0)


class ChangeLog:
    """The keys written since each cut, in segments named by their cut. Only the partition's
    writer and the snapshots' synchronous parts call it, under the job's lock. A write's keys are
    kept as it gave them (a reference, or a list of its dict's keys): a commit pays nothing per row
    here; the checkpoint merges them off the request path. A seed's cut stays *pinned* (what was
    written since it kept) until a checkpoint takes the seed: checkpoints of the layout before a
    move come between a seed and the checkpoint that uses it."""

    def __init__(self, max_rows: int = MAX_NOTED_ROWS) -> None:
        self.max_rows = max_rows
        self._current = Segment()
        self._segments: list[tuple[Cut, Segment]] = []
        self._cuts: set[Cut] = set()  # the cuts since the log was last lost
        self._pinned: Cut | None = None
        self._noted = 0  # rows in the segments and the current one, repeats counted
        self._value_bytes = 0  # the bytes of the values they keep
        self.lost_reason: str | None = None

    def note_flat(self, flat: Mapping[str, FlatChanges]) -> None:
        if not self._cuts:  # no checkpoint a later one could build on: nothing to note
            return
        keys = self._current.keys
        for table, changes in flat.items():
            if table == META_TABLE:
                continue
            noted = keys.get(table)
            if noted is None:
                noted = keys[table] = []
            if isinstance(changes, RowChanges):
                written: Keys = (changes.primaries, changes.key_groups)
                values: Sequence[bytes | None] = changes.records
            else:
                written, values = list(changes), list(changes.values())
            size = sum(map(len, filter(None, values)))  # C loops: ~20 ns a row
            if self._value_bytes + size <= MAX_NOTED_VALUE_BYTES:
                self._value_bytes += size
                noted.append(Written(written, values, size))
            else:
                noted.append(Written(written))
            self._count(_rows(written))

    def note_ops(self, ops: Sequence[WriteOp]) -> None:
        if not self._cuts:
            return
        keys = self._current.keys
        for op in ops:
            if op.table != META_TABLE:
                keys.setdefault(op.table, []).append(Written([(op.key_group, op.primary)]))
        self._count(len(ops))

    def note_whole(self, key_groups: Iterable[int]) -> None:
        """These key groups were replaced whole (dropped, or loaded in bulk): a checkpoint whose
        range holds one writes a base (a move loads and drops key groups outside the range its
        checkpoints cover, which no delta holds anyway)."""
        if self._cuts:
            self._current.whole.update(key_groups)

    def _count(self, rows: int) -> None:
        self._noted += rows
        if self._noted > self.max_rows:
            self.lose(f"{self._noted:,} rows noted since the last completed checkpoint")

    def lose(self, reason: str) -> None:
        """The changes cannot be told key by key from here on: no checkpoint before now is built on."""
        if self._cuts:
            log.info("heap changelog lost (%s): the next checkpoint writes a full base", reason)
        self.lost_reason = reason
        self._current, self._segments, self._cuts, self._noted = Segment(), [], set(), 0
        self._value_bytes = 0
        self._pinned = None

    def cut(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` froze the partition: what was noted is its segment."""
        self._cut(checkpoint_cut(checkpoint_id))

    def cut_seed(self) -> Cut:
        """A seed froze the partition: its cut, pinned until a checkpoint builds on it."""
        cut = (max((c[0] for c in self._cuts), default=0), 1)
        self._cut(cut)
        self._pinned = cut
        return cut

    def unpin(self, cut: Cut) -> None:
        """A seed's cut no checkpoint will build on (its move aborted, or a checkpoint took the
        seed): unpinned, so that the next checkpoint lets go of what was noted since it."""
        if self._pinned == cut:
            self._pinned = None

    def _cut(self, cut: Cut) -> None:
        self._segments.append((cut, self._current))
        self._current = Segment()
        self._cuts.add(cut)
        self.lost_reason = None

    def since(self, cut: Cut) -> list[Segment] | None:
        """The segments cut after ``cut`` (None: the log did not follow every change since then).
        Segments up to it are forgotten (up to the pinned seed's, while one is): a completed
        checkpoint is never built on by one older than the newest completed. The checkpoint that
        takes a seed unpins its cut (:meth:`unpin`) once it has its segments."""
        if cut not in self._cuts:
            return None
        kept = cut if self._pinned is None else min(cut, self._pinned)
        self._segments = [(c, segment) for c, segment in self._segments if c > kept]
        self._cuts = {c for c in self._cuts if c >= kept}
        kept_segments = [*(segment for _c, segment in self._segments), self._current]
        self._noted = noted_rows(kept_segments)
        self._value_bytes = sum(w.value_bytes for w in _writes(kept_segments))
        return [segment for c, segment in self._segments if c > cut]


def _rows(keys: Keys) -> int:
    return len(keys[0]) if isinstance(keys, tuple) else len(keys)


def _writes(segments: list[Segment]) -> Iterator[Written]:
    return (w for segment in segments for writes in segment.keys.values() for w in writes)


def noted_rows(segments: list[Segment]) -> int:
    """The rows written in ``segments``, repeats counted (no merge)."""
    return sum(_rows(w.keys) for w in _writes(segments))


def replaced_whole(segments: list[Segment]) -> set[int]:
    """The key groups ``segments`` replaced whole."""
    return set().union(*(segment.whole for segment in segments))


def union(segments: list[Segment], most: int) -> Changed | None:
    """The keys of ``segments`` together, per table each ``(key group, primary)`` once (a primary
    alone does not name its key group: raw keyed state has one stream per key group, all under one
    primary) with its last kept value; None once they are ``most`` or more (then a base is
    cheaper: the rest is not merged)."""
    found = Changed({}, {})
    count = 0
    for segment in segments:
        for table, writes in segment.keys.items():
            noted = found.values.setdefault(table, {})
            for written in writes:
                before = len(noted)
                keys = written.keys
                pairs = zip(keys[1], keys[0], strict=True) if isinstance(keys, tuple) else keys
                if written.values is None:
                    noted.update(zip(pairs, repeat(None)))
                    groups = keys[1] if isinstance(keys, tuple) else map(_KEY_GROUP, keys)
                    found.unread.setdefault(table, set()).update(groups)
                else:
                    noted.update(zip(pairs, written.values, strict=True))
                count += len(noted) - before
                if count >= most:
                    return None
    return found


def by_key_group(changed: Changed) -> dict[str, dict[int, dict[bytes, bytes | None]]]:
    """Per table and key group, the changed primaries of ``changed`` and their values."""
    grouped: dict[str, dict[int, dict[bytes, bytes | None]]] = {}
    for table, noted in changed.values.items():
        by_group: dict[int, dict[bytes, bytes | None]] = {}
        for (kg, primary), value in noted.items():
            group = by_group.get(kg)
            if group is None:
                group = by_group[kg] = {}
            group[primary] = value
        grouped[table] = by_group
    return grouped
