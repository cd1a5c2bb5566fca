"""Read-your-writes transactions over a partition, committed as one atomic write.

Every keyed operation runs in a transaction: a batch of operations sees its own earlier
writes, and if any operation fails nothing reaches the partition.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Protocol, TypeAlias

from statehouse.backends.base.partition import FlatChanges, RowChanges, WriteOp
from statehouse.backends.errors import InsufficientStorage

_DELETED = None
_ABSENT: object = object()
_PRIMARY = itemgetter(1)  # of a flat table's (key group, primary) change
_KEY_GROUP = itemgetter(0)
# Checks a write to a table in some key groups before it is taken, raising if it must not be
# (``KeySpace.check_writes``: a live rescale's frozen key groups).
WriteGuard: TypeAlias = Callable[[str, Collection[int]], None]
# Told a transaction's changes before they are written (``ChangeTracker.note``: a pre-copy
# move's record of what changed in its key groups).
ChangeNote: TypeAlias = Callable[[Mapping[str, FlatChanges], list[WriteOp]], None]


class _PendingKey:
    """Uncommitted changes under one primary key."""

    __slots__ = ("cleared", "values")

    def __init__(self) -> None:
        self.cleared = False
        self.values: dict[bytes, bytes | None] = {}


class TransactionSource(Protocol):
    """What a transaction reads through and commits to: a partition, or another transaction's
    view (a task attempt's staged writes, see :class:`StagedView`)."""

    def tables(self) -> dict[str, bool]: ...

    def get(self, table: str, key_group: int, primary: bytes, secondary: bytes = b"") -> bytes | None: ...

    def get_many(
        self,
        table: str,
        key_groups: Sequence[int],
        primaries: Sequence[bytes],
        secondaries: Sequence[bytes] | None = None,
        budget: int | None = None,
    ) -> list[bytes | None]: ...

    def items(self, table: str, key_group: int, primary: bytes) -> Iterator[tuple[bytes, bytes]]: ...

    def items_from(
        self, table: str, key_group: int, primary: bytes, after: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]: ...

    def primaries_from(self, table: str, key_group: int, after: bytes | None) -> Iterator[bytes]: ...

    def write_changes(self, flat: Mapping[str, FlatChanges], ops: list[WriteOp]) -> None: ...


class PartitionTransaction:
    """The pending changes of one request over a :class:`TransactionSource` (a partition, or a
    task attempt's staged view), read through and committed as one atomic write.

    It owns the uncommitted writes: flat tables' values per (key group, primary) (or a columnar
    put's rows as they came), nested tables' entries per primary with their clears, and the
    write guard every caller's write is checked with (a live rescale's frozen key groups). A
    read sees the transaction's own writes over the source's data, so a batch of operations
    reads what it wrote before; a failed operation rolls all of them back, and nothing reached
    the source. Typed access to a job's states is ``JobTransaction``'s, over one of these."""

    def __init__(
        self, partition: TransactionSource, guard: WriteGuard | None = None, note: ChangeNote | None = None
    ) -> None:
        self.partition = partition
        self._note = note
        # Every write the caller makes is checked by it (TTL cleanups are not: they change
        # nothing visible, and a read must not fail for them; changes taken from another
        # transaction were checked there).
        self._guard = guard
        self._nested = partition.tables()
        # Flat tables (one value per primary, the common case) keep per table a plain dict of
        # pending values, which the partition commits as it is (no object per row), or the
        # rows of the table's only write (RowChanges: a columnar request's put, made a dict
        # only if something reads it); nested tables (maps) keep per-primary entries that a
        # clear can drop at once.
        self._flat: dict[str, dict[tuple[int, bytes], bytes | None] | RowChanges] = {}
        self._pending: dict[tuple[str, int, bytes], _PendingKey] = {}
        self._pending_tables: set[str] = set()
        self._written = False  # a change other than a TTL cleanup is pending (see commit)

    def _is_nested(self, table: str) -> bool:
        nested = self._nested.get(table)
        if nested is None:  # a table created after this transaction began (long-lived views)
            self._nested = self.partition.tables()
            nested = self._nested[table]
        return nested

    def _changes(self, table: str) -> dict[tuple[int, bytes], bytes | None]:
        """The table's pending changes, as a dict to read or change."""
        changes = self._flat.get(table)
        if changes is None:
            changes = self._flat[table] = {}
        elif isinstance(changes, RowChanges):  # a dict of its own: the rows may be another's too (see write_changes)
            changes = self._flat[table] = changes.to_dict()
        return changes

    def _pending_flat(self, table: str) -> Mapping[tuple[int, bytes], bytes | None] | None:
        """The table's pending changes to read, if it has any (rows kept as rows are not copied)."""
        changes = self._flat.get(table)
        return changes.as_dict() if isinstance(changes, RowChanges) else changes

    def _slot(self, table: str, key_group: int, primary: bytes) -> _PendingKey:
        slot = self._pending.get((table, key_group, primary))
        if slot is None:
            slot = self._pending[(table, key_group, primary)] = _PendingKey()
            self._pending_tables.add(table)
        return slot

    def get(self, table: str, key_group: int, primary: bytes, secondary: bytes = b"") -> bytes | None:
        if not self._is_nested(table):
            changes = self._pending_flat(table)
            value = _ABSENT if changes is None else changes.get((key_group, primary), _ABSENT)
            return self.partition.get(table, key_group, primary) if value is _ABSENT else value  # type: ignore[return-value]
        slot = self._pending.get((table, key_group, primary))
        if slot is not None:
            if secondary in slot.values:
                return slot.values[secondary]
            if slot.cleared:
                return None
        return self.partition.get(table, key_group, primary, secondary)

    def get_many(
        self,
        table: str,
        key_groups: Sequence[int],
        primaries: Sequence[bytes],
        secondaries: Sequence[bytes] | None = None,
        budget: int | None = None,
    ) -> list[bytes | None]:
        """:meth:`get` for many rows: what this transaction changed, else one read of the source
        (``budget``: as the partition's ``get_many`` takes it; fewer rows may come back)."""
        if self._is_nested(table):
            if table not in self._pending_tables:
                return self.partition.get_many(table, key_groups, primaries, secondaries, budget)
            assert secondaries is not None
            return [self.get(table, kg, p, s) for kg, p, s in zip(key_groups, primaries, secondaries, strict=True)]
        changes = self._pending_flat(table)
        if not changes:
            return self.partition.get_many(table, key_groups, primaries, None, budget)
        found: list = list(map(changes.get, zip(key_groups, primaries, strict=True), repeat(_ABSENT)))
        missing = [i for i, value in enumerate(found) if value is _ABSENT]
        if missing:
            fetched = self.partition.get_many(
                table, [key_groups[i] for i in missing], [primaries[i] for i in missing], None, budget
            )
            if len(fetched) < len(missing):  # the budget ran out: the rows up to there
                found = found[: missing[len(fetched)]]
            for i, value in zip(missing, fetched, strict=False):
                found[i] = value
        return found

    def items(self, table: str, key_group: int, primary: bytes) -> Iterator[tuple[bytes, bytes]]:
        if not self._is_nested(table):
            value = self.get(table, key_group, primary)
            return iter(() if value is None else ((b"", value),))
        slot = self._pending.get((table, key_group, primary))
        if slot is None:
            return self.partition.items(table, key_group, primary)
        merged = {} if slot.cleared else dict(self.partition.items(table, key_group, primary))
        for secondary, value in slot.values.items():
            if value is _DELETED:
                merged.pop(secondary, None)
            else:
                merged[secondary] = value
        return iter(sorted(merged.items()))

    def items_from(
        self, table: str, key_group: int, primary: bytes, after: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        """:meth:`items` whose secondary sorts after ``after``: the source seeks there (a page
        of a listing reads the page, not the map), with this transaction's changes laid over."""
        if not self._is_nested(table):
            return iter(()) if after is not None else self.items(table, key_group, primary)
        slot = self._pending.get((table, key_group, primary))
        if slot is None:
            return self.partition.items_from(table, key_group, primary, after)
        stored = iter(()) if slot.cleared else self.partition.items_from(table, key_group, primary, after)
        changed = slot.values
        kept = ((s, v) for s, v in stored if s not in changed)
        pending = sorted((s, v) for s, v in changed.items() if v is not _DELETED and (after is None or s > after))
        return heapq.merge(kept, pending)

    def primaries_from(self, table: str, key_group: int, after: bytes | None) -> Iterator[bytes]:
        """The primaries of a *flat* table's key group sorting after ``after``, in byte order, as
        this transaction sees them: the source's (seeked), with this transaction's changes laid
        over (timers are scanned this way, through an attempt's staged view too)."""
        if self._is_nested(table):
            raise TypeError(f"primaries_from through a transaction reads flat tables only, not {table!r}")
        stored = self.partition.primaries_from(table, key_group, after)
        changes = self._pending_flat(table)
        if not changes:
            return stored
        mine = {p: v for (kg, p), v in changes.items() if kg == key_group and (after is None or p > after)}
        if not mine:
            return stored
        kept = (p for p in stored if p not in mine)
        return heapq.merge(kept, sorted(p for p, v in mine.items() if v is not _DELETED))

    def put(self, table: str, key_group: int, primary: bytes, value: bytes, secondary: bytes = b"") -> None:
        if self._guard is not None:
            self._guard(table, (key_group,))
        self._put(table, key_group, primary, value, secondary)

    def _put(self, table: str, key_group: int, primary: bytes, value: bytes, secondary: bytes = b"") -> None:
        self._written = True
        if self._is_nested(table):
            self._slot(table, key_group, primary).values[secondary] = value
        else:
            self._changes(table)[(key_group, primary)] = value

    def put_many(
        self,
        table: str,
        key_groups: Sequence[int],
        primaries: Sequence[bytes],
        values: Sequence[bytes | None],
        secondaries: Sequence[bytes] | None = None,
        *,
        deletes: bool | None = None,
    ) -> None:
        """:meth:`put` row by row, in order; a ``None`` value deletes (a row without a value).
        ``deletes``: whether some value is ``None``, when the caller knows (else it is looked for)."""
        if self._guard is not None:
            self._guard(table, key_groups)
        self._written = True
        if not self._is_nested(table):
            if self._flat.get(table):
                self._changes(table).update(zip(zip(key_groups, primaries, strict=True), values, strict=True))
            else:  # the table's first change: kept as the rows came (the sequences are not copied)
                self._flat[table] = RowChanges(key_groups, primaries, values, deletes)
            return
        assert secondaries is not None
        for kg, primary, secondary, value in zip(key_groups, primaries, secondaries, values, strict=True):
            self._slot(table, kg, primary).values[secondary] = value

    def delete(self, table: str, key_group: int, primary: bytes, secondary: bytes = b"") -> None:
        if self._guard is not None:
            self._guard(table, (key_group,))
        self._delete(table, key_group, primary, secondary)

    def _delete(self, table: str, key_group: int, primary: bytes, secondary: bytes = b"") -> None:
        self._written = True
        if self._is_nested(table):
            self._slot(table, key_group, primary).values[secondary] = _DELETED
        else:
            self._changes(table)[(key_group, primary)] = _DELETED

    def clear(self, table: str, key_group: int, primary: bytes) -> None:
        if self._guard is not None:
            self._guard(table, (key_group,))
        self._clear(table, key_group, primary)

    def _clear(self, table: str, key_group: int, primary: bytes) -> None:
        self._written = True
        if not self._is_nested(table):
            self._changes(table)[(key_group, primary)] = _DELETED
            return
        slot = self._slot(table, key_group, primary)
        slot.cleared = True
        slot.values.clear()

    def clear_many(self, table: str, key_groups: Sequence[int], primaries: Sequence[bytes]) -> None:
        if self._guard is not None:
            self._guard(table, key_groups)
        self._written = True
        if not self._is_nested(table):
            self._changes(table).update(zip(zip(key_groups, primaries, strict=True), repeat(_DELETED)))
            return
        for kg, primary in zip(key_groups, primaries, strict=True):
            self._clear(table, kg, primary)

    # -- TTL cleanup: Flink's cleanup on read and incremental cleanup, not the caller's writes --

    def delete_expired(self, table: str, key_group: int, primary: bytes, secondary: bytes = b"") -> None:
        """:meth:`delete` of an expired record (or, in a flat table, the whole row): a cleanup,
        which :meth:`commit` may drop (an expired record is invisible whether or not it is gone)."""
        written = self._written
        self._delete(table, key_group, primary, secondary)
        self._written = written

    def put_cleaned(self, table: str, key_group: int, primary: bytes, value: bytes, secondary: bytes = b"") -> None:
        """:meth:`put` of a record with its expired elements dropped: a cleanup, as
        :meth:`delete_expired` is."""
        written = self._written
        self._put(table, key_group, primary, value, secondary)
        self._written = written

    def write_changes(self, flat: Mapping[str, FlatChanges], ops: list[WriteOp]) -> None:
        """Take another transaction's changes as this one's (a request's into its attempt's view;
        the winning views into the epoch's commit)."""
        self._written = True
        for table, changes in flat.items():
            if isinstance(changes, RowChanges):
                if not self._flat.get(table):
                    self._flat[table] = changes
                    continue
                # An attempt's later request into its view: its rows in order, no dict of them made
                self._changes(table).update(changes.rows())
                continue
            self._changes(table).update(changes)
        for op in ops:
            if op.kind == "put":
                assert op.value is not None
                self._put(op.table, op.key_group, op.primary, op.value, op.secondary)
            elif op.kind == "delete":
                self._delete(op.table, op.key_group, op.primary, op.secondary)
            else:
                self._clear(op.table, op.key_group, op.primary)

    def _nested_ops(self) -> list[WriteOp]:
        ops = []
        for (table, key_group, primary), slot in self._pending.items():
            if slot.cleared:
                ops.append(WriteOp("clear", table, key_group, primary))
            for secondary, value in slot.values.items():
                if value is _DELETED:
                    if not slot.cleared:
                        ops.append(WriteOp("delete", table, key_group, primary, secondary))
                else:
                    ops.append(WriteOp("put", table, key_group, primary, secondary, value))
        return ops

    def commit(self) -> bool:
        """Write the changes atomically; whether they were written.

        A transaction whose only changes are TTL cleanups (a read's) is dropped, not refused,
        when the volume takes no writes (507 below the disk reserve, or a degraded job): a read
        must answer on a full disk. What it would have removed is expired, so it stays invisible
        (Flink's ``NeverReturnExpired``), or is still returned as not cleaned up; a later access
        cleans it once the volume takes writes again."""
        flat, ops = self.changes()
        cleanup_only = not self._written
        self.rollback()
        if not (flat or ops):
            return False
        if self._note is not None:
            self._note(flat, ops)  # before: a change noted and not written is harmless, the reverse not
        try:
            self.partition.write_changes(flat, ops)
        except InsufficientStorage:
            if not cleanup_only:
                raise
            return False
        return True

    def changes(self) -> tuple[dict[str, FlatChanges], list[WriteOp]]:
        """What this transaction would write: flat tables' changes, and nested tables' ops."""
        return {table: changes for table, changes in self._flat.items() if changes}, self._nested_ops()

    def touched(self) -> dict[str, Collection[bytes]]:
        """Per table, the primaries this transaction changes (in a table, a primary names its
        key group too), as the rows came: a columnar write's primaries are not copied."""
        touched: dict[str, Collection[bytes]] = {}
        for table, changes in self._flat.items():
            if changes:
                touched[table] = changes.primaries if isinstance(changes, RowChanges) else list(map(_PRIMARY, changes))
        nested: dict[str, list[bytes]] = {}
        for table, _kg, primary in self._pending:
            nested.setdefault(table, []).append(primary)
        return touched | nested

    def key_groups(self, tables: Collection[str] | None = None) -> set[int]:
        """The key groups this transaction changes, in every table or in ``tables`` (a live
        rescale asks which key groups an attempt's staged writes touch)."""
        found: set[int] = set()
        for table, changes in self._flat.items():
            if tables is None or table in tables:
                found.update(changes.key_groups if isinstance(changes, RowChanges) else map(_KEY_GROUP, changes))
        found.update(kg for table, kg, _primary in self._pending if tables is None or table in tables)
        return found

    def rollback(self) -> None:
        self._flat = {}
        self._pending = {}
        self._pending_tables = set()
        self._written = False


class StagedView(PartitionTransaction):
    """A transaction that is never committed, read through by other transactions: a task
    attempt's staged writes over the job's partition. Each request of the attempt runs in its
    own transaction over this view, so a failed request leaves the view as it was."""

    def tables(self) -> dict[str, bool]:
        return self.partition.tables()

    def commit(self) -> bool:
        raise TypeError("a staged view is never committed: its attempt's writes are replayed at the epoch commit")
