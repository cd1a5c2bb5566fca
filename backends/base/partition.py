"""One job's storage: named tables of ``(key group, primary, secondary) -> bytes``.

The keyed-state logic (kinds, TTL, namespaces) lives above this interface and is shared by
all backends; a backend only stores bytes. A table is *nested* when one primary key holds
many secondary keys (map state: primary = key + namespace, secondary = user key); in a flat
table the secondary key is always empty.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from itertools import islice
from typing import Any, Literal, NamedTuple

from statehouse.backends.reserved import META_TABLE
from statehouse.protocol.keygroups import KeyGroupRange


class WriteOp(NamedTuple):
    """One write of an atomic batch.

    ``put``/``delete`` address one (primary, secondary); ``clear`` removes every secondary
    of a primary (a whole map, or the single entry of a flat table).
    """

    kind: Literal["put", "delete", "clear"]
    table: str
    key_group: int
    primary: bytes
    secondary: bytes = b""
    value: bytes | None = None


# A flat table's changes in one transaction: (key group, primary) -> value, None deleting it.
FlatChanges = Mapping[tuple[int, bytes], bytes | None]


class RowChanges(FlatChanges):
    """A flat table's changes as the rows that made them, in order (a later row of a key wins):
    a columnar request's writes, kept as its columns (``key_groups``, ``primaries``, ``records``,
    a ``None`` record deleting) so that a backend can write them without building a dict. Read
    as a mapping, it is the dict of the rows' final values. The sequences are not copied:
    whoever makes one gives them away."""

    __slots__ = ("_deletes", "_dict", "key_groups", "primaries", "records")

    def __init__(
        self,
        key_groups: Sequence[int],
        primaries: Sequence[bytes],
        records: Sequence[bytes | None],
        deletes: bool | None = None,
    ) -> None:
        if not len(key_groups) == len(primaries) == len(records):
            raise ValueError(f"{len(key_groups)} key groups, {len(primaries)} primaries and {len(records)} records")
        self.key_groups, self.primaries, self.records = key_groups, primaries, records
        self._deletes = deletes
        self._dict: dict[tuple[int, bytes], bytes | None] | None = None

    @property
    def deletes(self) -> bool:
        """Whether a row deletes (a ``None`` record): given by the maker when it knows, else looked for."""
        if self._deletes is None:
            self._deletes = None in self.records
        return self._deletes

    def as_dict(self) -> dict[tuple[int, bytes], bytes | None]:
        """The changes as a dict (made once; do not change it)."""
        if self._dict is None:
            self._dict = dict(zip(zip(self.key_groups, self.primaries, strict=True), self.records, strict=True))
        return self._dict

    def to_dict(self) -> dict[tuple[int, bytes], bytes | None]:
        """The changes as a dict the caller owns and may change: the one :meth:`as_dict` made, if
        any (forgotten here: the rows make another if need be), else a new one."""
        made, self._dict = self._dict, None
        return made if made is not None else dict(self.rows())

    def rows(self) -> Iterator[tuple[tuple[int, bytes], bytes | None]]:
        """``((key group, primary), record)`` of each row, in order: what updating a dict with
        them takes, without making :meth:`as_dict` first."""
        return zip(zip(self.key_groups, self.primaries, strict=True), self.records, strict=True)

    def __getitem__(self, key: tuple[int, bytes]) -> bytes | None:
        return self.as_dict()[key]

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())

    def __bool__(self) -> bool:
        return len(self.primaries) > 0

    def items(self) -> ItemsView[tuple[int, bytes], bytes | None]:
        return self.as_dict().items()


class FrozenView(ABC):
    """A consistent read-only view of a partition taken at one instant (for snapshots).

    Writes to the partition after the view was taken are not visible in it.
    """

    @abstractmethod
    def tables(self) -> dict[str, bool]:
        """Table name -> nested, as of the freeze."""

    @abstractmethod
    def scan(self, table: str, key_group: int) -> Iterator[tuple[bytes, bytes, bytes]]:
        """``(primary, secondary, value)`` of one key group, in byte order."""

    @abstractmethod
    def release(self) -> None:
        """Let the partition stop preserving this view."""

    def __enter__(self) -> FrozenView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class StorePartition(ABC):
    """The bytes of one job on one replica. Every partition has the flat table ``$meta``."""

    max_parallelism: int

    @property
    def is_open(self) -> bool:
        """Whether an access needs no (re)open first; a store may close idle partitions."""
        return True

    @abstractmethod
    def tables(self) -> dict[str, bool]:
        """Table name -> nested."""

    @abstractmethod
    def create_table(self, table: str, nested: bool) -> None: ...

    @abstractmethod
    def drop_table(self, table: str) -> None: ...

    @abstractmethod
    def get(self, table: str, key_group: int, primary: bytes, secondary: bytes = b"") -> bytes | None: ...

    def get_many(
        self,
        table: str,
        key_groups: Sequence[int],
        primaries: Sequence[bytes],
        secondaries: Sequence[bytes] | None = None,
        budget: int | None = None,
    ) -> list[bytes | None]:
        """:meth:`get` for many rows at once (a columnar request); backends answer it faster.

        ``budget``: the bytes the caller will take (``limits.AnswerMeter``); a backend whose
        reads copy the values stops reading once they pass it, and answers fewer rows."""
        if secondaries is None:
            return [self.get(table, kg, p) for kg, p in zip(key_groups, primaries, strict=True)]
        return [self.get(table, kg, p, s) for kg, p, s in zip(key_groups, primaries, secondaries, strict=True)]

    @abstractmethod
    def items(self, table: str, key_group: int, primary: bytes) -> Iterator[tuple[bytes, bytes]]:
        """``(secondary, value)`` under one primary key, in byte order."""

    @abstractmethod
    def scan(self, table: str, key_group: int) -> Iterator[tuple[bytes, bytes, bytes]]:
        """``(primary, secondary, value)`` of one key group in byte order.

        Safe to interleave with writes: the iteration sees the data as of its start.
        """

    # Seeking reads, for listings that page: each starts at its position instead of reading
    # what comes before it, so a page costs what it returns (plus one seek), not the map size.
    # Their iterators are meant to be consumed at once, under the job's lock (no write between).

    @abstractmethod
    def items_from(
        self, table: str, key_group: int, primary: bytes, after: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        """:meth:`items` whose secondary sorts after ``after`` (all of them when ``None``)."""

    @abstractmethod
    def primaries_from(self, table: str, key_group: int, after: bytes | None) -> Iterator[bytes]:
        """Every distinct primary of one key group sorting after ``after``, in byte order (a
        nested table's map is one primary however many entries it has)."""

    @abstractmethod
    def entries_from(self, table: str, key_group: int, after: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """``(primary, value)`` of a flat table's key group, primaries sorting after ``after``, in
        byte order: :meth:`primaries_from` with each value, read in one pass."""

    @abstractmethod
    def write(self, ops: list[WriteOp]) -> None:
        """Apply all ops atomically and in order."""

    def write_changes(self, flat: Mapping[str, FlatChanges], ops: list[WriteOp]) -> None:
        """Apply a transaction atomically: the changes of flat tables, then ``ops`` (nested
        tables). Backends take the flat changes as they are, without a ``WriteOp`` per row."""
        self.write(
            [
                WriteOp("delete", table, kg, primary)
                if value is None
                else WriteOp("put", table, kg, primary, b"", value)
                for table, changes in flat.items()
                for (kg, primary), value in changes.items()
            ]
            + ops
        )

    def load_entries(self, entries: Iterable[Entry], directory: str, guard: Guard) -> int:
        """Load ``entries`` (key group ascending) into key groups that hold nothing, each change
        inside ``guard()``; how many. As writes here; a backend may build files in ``directory``
        (which the caller removes) and add them whole."""
        return load_records(self, (WriteOp("put", t, kg, p, s, v) for kg, t, p, s, v in entries), guard)

    def load_sections(self, tables: Sequence[str], sections: Sections, directory: str, guard: Guard) -> int:
        """:meth:`load_entries` of a snapshot's sections: per key group (ascending), its records
        ``(table id, primary, secondary, value)``, ids indexing ``tables``. A backend may take a
        section at a time."""
        entries = ((kg, tables[r[0]], r[1], r[2], r[3]) for kg, records in sections for r in records)
        return self.load_entries(entries, directory, guard)

    def load(self, ops: Iterable[WriteOp]) -> int:
        """Bulk-load a restore into a staged partition (nobody reads it until it is promoted, so
        batches need not be atomic together); returns how many entries were written."""
        return load_records(self, ops, nullcontext)

    @abstractmethod
    def drop_key_groups(self, tables: Sequence[str], ranges: Sequence[KeyGroupRange]) -> None:
        """Delete every entry of ``tables`` (keyed tables) in the key groups of ``ranges`` at once,
        without reading them (a live rescale drops what moved away, or a partial load)."""

    def reclaim_key_groups(self, tables: Sequence[str], ranges: Sequence[KeyGroupRange]) -> None:  # noqa: B027
        """Free the space of key groups :meth:`drop_key_groups` dropped, if the backend keeps it
        until later (safe beside writes, outside the job's lock). Nothing to do by default."""

    @abstractmethod
    def freeze(self) -> FrozenView:
        """The cheap synchronous part of a snapshot: a consistent view, no full copy."""

    def flush(self) -> None:  # noqa: B027 - optional hook, a no-op unless a backend needs it
        """Make a following :meth:`freeze` cheaper; safe to call from another thread while
        writes continue (RocksDB: write the memtables out). Nothing to do by default."""

    @abstractmethod
    def close(self) -> None: ...

    def get_meta(self, key: bytes) -> bytes | None:
        return self.get(META_TABLE, 0, key)

    def meta_items(self) -> Iterator[tuple[bytes, bytes]]:
        for primary, _secondary, value in self.scan(META_TABLE, 0):
            yield primary, value


# A stored entry as a snapshot holds it: (key group, table, primary, secondary, value).
Entry = tuple[int, str, bytes, bytes, bytes]
# A snapshot's sections as a bulk load takes them: per key group, its records
# ``(table id, primary, secondary, value)``.
Sections = Iterable[tuple[int, Sequence[Sequence[Any]]]]
# Writes a load makes at once: each goes under its guard (a live job's lock), so a replica's
# requests go on between them, and memory holds one batch.
LOAD_BATCH = 5_000
Guard = Callable[[], AbstractContextManager[object]]


def load_records(partition: StorePartition, ops: Iterable[WriteOp], guard: Guard) -> int:
    """Write ``ops`` into ``partition`` :data:`LOAD_BATCH` at a time, each batch inside
    ``guard()``; how many were written."""
    written = 0
    source = iter(ops)
    while batch := list(islice(source, LOAD_BATCH)):
        with guard():
            partition.write(batch)
        written += len(batch)
    return written
