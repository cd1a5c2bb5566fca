"""Heap partition: per table, one dict per key group, with copy-on-write freezes.

Copy-on-write follows Flink's ``CopyOnWriteStateMap`` at a coarser grain. Every
container (a key group's dict, and in nested tables each primary's dict of map entries)
records the partition version it was created at. ``freeze()`` bumps the version and
captures references to the current key-group dicts, which costs O(key groups), not
O(state). A later write to a container older than the newest live freeze copies that
container first, so frozen views never change; after all views are released nothing
is copied any more.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence

from statehouse.backends.base.partition import FlatChanges, FrozenView, StorePartition, WriteOp
from statehouse.backends.reserved import META_TABLE


class _Container:
    __slots__ = ("data", "version")

    def __init__(self, version: int, data: dict) -> None:
        self.version = version
        self.data = data


class _Table:
    __slots__ = ("groups", "nested")

    def __init__(self, nested: bool) -> None:
        self.nested = nested
        self.groups: dict[int, _Container] = {}


def _sorted_entries(nested: bool, group: dict) -> Iterator[tuple[bytes, bytes, bytes]]:
    """``(primary, secondary, value)`` in byte order over a dict nobody mutates."""
    if not nested:
        for primary in sorted(group):
            yield primary, b"", group[primary]
        return
    for primary in sorted(group):
        entries = group[primary].data
        for secondary in sorted(entries):
            yield primary, secondary, entries[secondary]


class HeapFrozenView(FrozenView):
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

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._partition._release(self._version)


class HeapPartition(StorePartition):
    def __init__(self, max_parallelism: int) -> None:
        self.max_parallelism = max_parallelism
        self._tables: dict[str, _Table] = {META_TABLE: _Table(nested=False)}
        self._version = 0
        self._live_versions: set[int] = set()
        self._required_version = 0  # containers older than this are shared with a view
        self._lock = threading.Lock()  # guards the version bookkeeping only

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
    ) -> list[bytes | None]:
        t = self._tables[table]
        containers, empty = t.groups, _Container(0, {})
        if not t.nested:
            return [containers.get(kg, empty).data.get(p) for kg, p in zip(key_groups, primaries, strict=True)]
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

    # -- writes ------------------------------------------------------------------------

    def create_table(self, table: str, nested: bool) -> None:
        if table not in self._tables:
            self._tables[table] = _Table(nested)

    def drop_table(self, table: str) -> None:
        self._tables.pop(table, None)

    def _writable(self, container: _Container | None) -> _Container:
        if container is None:
            return _Container(self._version, {})
        if container.version < self._required_version:
            return _Container(self._version, dict(container.data))
        return container

    def _check_tables(self, tables: Iterator[str]) -> None:
        # Validate every table first so a batch is applied whole or not at all.
        for table in tables:
            if table not in self._tables:
                raise KeyError(f"no table {table!r}")

    def write(self, ops: list[WriteOp]) -> None:
        self._check_tables(op.table for op in ops)
        self._apply(ops)

    def write_changes(self, flat: Mapping[str, FlatChanges], ops: list[WriteOp]) -> None:
        self._check_tables(iter(flat))
        self._check_tables(op.table for op in ops)
        for table, changes in flat.items():
            groups = self._tables[table].groups
            writable: dict[int, dict] = {}  # key group -> its dict, made writable once
            for (kg, primary), value in changes.items():
                data = writable.get(kg)
                if data is None:
                    container = groups.get(kg)
                    if value is None and container is None:
                        continue
                    container = groups[kg] = self._writable(container)
                    data = writable[kg] = container.data
                if value is None:
                    data.pop(primary, None)
                else:
                    data[primary] = value
        self._apply(ops)

    def _apply(self, ops: list[WriteOp]) -> None:
        for op in ops:
            t = self._tables[op.table]
            group = t.groups.get(op.key_group)
            if op.kind != "put" and group is None:
                continue
            group = self._writable(group)
            t.groups[op.key_group] = group
            data = group.data
            if not t.nested or op.kind == "clear":
                if op.kind == "put":
                    data[op.primary] = op.value
                else:
                    data.pop(op.primary, None)
                continue
            entries = data.get(op.primary)
            if op.kind == "delete" and entries is None:
                continue
            entries = self._writable(entries)
            data[op.primary] = entries
            if op.kind == "put":
                entries.data[op.secondary] = op.value
            else:
                entries.data.pop(op.secondary, None)
                if not entries.data:
                    del data[op.primary]

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
