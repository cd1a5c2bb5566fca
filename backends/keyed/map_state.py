"""Flink's ``MapState``: each entry its own record with its own TTL timestamp; with a function,
``map_add`` folds into one entry."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any, NamedTuple

from statehouse.backends.errors import StateError, WrongStateKind
from statehouse.backends.keyed.base import Key, KeyedState, Rows, each_row, one_key
from statehouse.protocol.errors import InvalidValue
from statehouse.snapshots.stored.codec import decode_user_key, decode_value, encode_timestamped, split_timestamped
from statehouse.snapshots.stored.functions import StateFunction
from statehouse.snapshots.stored.ttl import is_expired


class MapPage(NamedTuple):
    entries: list[tuple[str, Any]]
    next_after: bytes | None  # where the next page starts (a stored user key); None: the end


class _Last:
    """Passes stored entries through, remembering the last one's secondary (a page's end)."""

    def __init__(self, stored: Iterator[tuple[bytes, bytes]]) -> None:
        self._stored = stored
        self.secondary: bytes | None = None

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        for entry in self._stored:
            self.secondary = entry[0]
            yield entry


class MapState(KeyedState):
    """Each entry is its own record with its own TTL timestamp (Flink's ``TtlMapState``)."""

    def get(self, key: Key, user_key: str, namespace: str = "") -> Any:
        return one_key(lambda: self.get_entries_many(self._row(key, namespace), [user_key])[0])

    def contains(self, key: Key, user_key: str, namespace: str = "") -> bool:
        return self.get(key, user_key, namespace) is not None

    def put(self, key: Key, user_key: str, value: Any, namespace: str = "") -> None:
        self.put_all(key, {user_key: value}, namespace)

    def put_all(self, key: Key, entries: Mapping[str, Any], namespace: str = "") -> None:
        rows = self._row(key, namespace, len(entries))
        one_key(lambda: self.put_entries_many(rows, list(entries), list(entries.values())))

    def _entries_in(self, entries: Mapping[str, Any]) -> list[tuple[bytes, Any]]:
        encoded = [(self._user_key(uk), self._input(v)) for uk, v in entries.items()]
        if any(v is None for _uk, v in encoded):
            raise InvalidValue("map values must not be null; remove the entry instead")
        return encoded

    def get_entries_many(self, rows: Rows, user_keys: Sequence[str], *, answers: bool = True) -> list[Any]:
        """:meth:`get` per row: one entry each; ``answers``: whether the values are the answer
        (else they are only tested, as ``map_contains`` does, and not charged to it)."""
        return self._read_many(rows, each_row(user_keys, self._user_key), answers=answers)

    def put_entries_many(self, rows: Rows, user_keys: Sequence[str], values: Sequence[Any]) -> None:
        """:meth:`put` per row, in order."""

        if None in values:
            row = list(values).index(None)
            raise InvalidValue(f"row {row}: map values must not be null; remove the entry instead", row=row)
        secondaries = each_row(user_keys, self._user_key)
        records = self._records_many(self._inputs(values))
        self._tx.put_many(self._table, rows.key_groups, rows.primaries, records, secondaries)

    def add_entries_many(self, rows: Rows, user_keys: Sequence[str], values: Sequence[Any]) -> None:
        """:meth:`add` per row, in order."""
        function = self._add_function()
        self._fold_many(rows, each_row(user_keys, self._user_key), values, function)

    def remove_many(self, rows: Rows, user_keys: Sequence[str]) -> None:
        secondaries = each_row(user_keys, self._user_key)
        self._tx.put_many(self._table, rows.key_groups, rows.primaries, [None] * len(secondaries), secondaries)

    def get_many(self, rows: Rows) -> list[dict[str, Any] | None]:
        """:meth:`get_all` per row: whole maps."""
        maps = []
        for row, (kg, primary) in enumerate(zip(rows.key_groups, rows.primaries, strict=True)):
            try:
                maps.append(self._map_at(kg, primary) or None)
            except StateError as exc:
                raise exc.within(f"row {row}", row=row) from None
        return maps

    def _map_at(self, kg: int, primary: bytes) -> dict[str, Any]:
        """The whole map as a dict, built straight from the entries as they are read: building
        it from a list of them would be one C call holding the GIL (~0.5 s for 1M entries)."""
        limit = self._limits.max_map_read_entries
        stored = self._answer.items(self._tx.items_from(self._table, kg, primary, None))
        found = dict(islice(self._live(kg, primary, stored), limit + 1))
        self._limits.check_map_read(len(found))
        return found

    def update_many(self, rows: Rows, maps: Sequence[Mapping[str, Any]]) -> None:
        """:meth:`update` per row, in order: each row replaces its key's whole map."""
        entries = each_row(maps, self._entries_in)
        for kg, primary, encoded in zip(rows.key_groups, rows.primaries, entries, strict=False):
            self._tx.clear(self._table, kg, primary)
            for secondary, value in encoded:
                self._write(kg, primary, value, secondary)

    def add(self, key: Key, user_key: str, value: Any, namespace: str = "") -> None:
        self.add_all(key, user_key, [value], namespace)

    def add_all(self, key: Key, user_key: str, values: Iterable[Any], namespace: str = "") -> None:
        """Fold values into one entry with the descriptor's function: ``ReducingState.add`` per
        user key. As ``put`` does, the write gives the entry a new TTL timestamp; an expired
        entry is never folded into."""
        elements = list(values)
        rows = self._row(key, namespace, len(elements))
        one_key(lambda: self.add_entries_many(rows, [user_key] * len(elements), elements))

    def _add_function(self) -> StateFunction:
        if self.descriptor.function is None:
            choices = ", ".join(sorted(self.descriptor.available_functions() or ()))
            raise WrongStateKind(
                f"map state {self._table!r} has no function to add with; register it again with "
                f"'function' (one of: {choices}), which keeps its entries, then add"
            )
        return self.descriptor.state_function

    def update(self, key: Key, entries: Mapping[str, Any], namespace: str = "") -> None:
        """Replace the whole map."""
        one_key(lambda: self.update_many(self._row(key, namespace), [entries]))

    def remove(self, key: Key, user_key: str, namespace: str = "") -> None:
        one_key(lambda: self.remove_many(self._row(key, namespace), [user_key]))

    def entries(self, key: Key, namespace: str = "") -> list[tuple[str, Any]]:
        """All live entries in user-key byte order; iteration applies the TTL rules per entry."""
        return self._entries_at(*self._locate(key, namespace))

    def _entries_at(self, kg: int, primary: bytes) -> list[tuple[str, Any]]:
        """The whole map: refused past ``max_map_read_entries`` (before reading further)."""
        limit = self._limits.max_map_read_entries
        stored = self._answer.items(self._tx.items_from(self._table, kg, primary, None))
        entries = list(islice(self._live(kg, primary, stored), limit + 1))
        self._limits.check_map_read(len(entries))
        return entries

    def entries_page(self, key: Key, namespace: str, after: bytes | None, limit: int) -> MapPage:
        """Up to ``limit`` live entries whose user key (UTF-8) sorts after ``after``, and where
        the next page starts. Reads from ``after`` on (a seek) and at most ``limit`` plus a
        bounded run of expired entries, never the whole map: a page costs what it returns."""
        kg, primary = self._locate(key, namespace)
        budget = 2 * limit + 1000  # stored entries one page reads; expired ones are dropped as read
        stored = islice(self._tx.items_from(self._table, kg, primary, after), budget)
        last = _Last(self._answer.items(stored))
        entries = list(islice(self._live(kg, primary, last), limit))
        if last.secondary is None:
            return MapPage(entries, None)
        # More follow if anything is stored past the last entry read (read raw: no TTL refresh
        # of an entry this page does not return). A page may come back short, even empty.
        following = next(self._tx.items_from(self._table, kg, primary, last.secondary), None)
        return MapPage(entries, last.secondary if following is not None else None)

    def _live(self, kg: int, primary: bytes, stored: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[str, Any]]:
        """The live entries of ``stored``, lazily, applying the TTL rules to each as it is read."""
        ttl = self._ttl
        if ttl is None:
            for secondary, raw in stored:
                yield decode_user_key(secondary), decode_value(raw)
            return
        now = self._clock.now_ms()
        for secondary, raw in stored:
            timestamp, payload = split_timestamped(raw)
            if is_expired(timestamp, ttl.ttl_ms, now):
                self._tx.delete_expired(self._table, kg, primary, secondary)
                if not ttl.return_expired:
                    continue
            elif ttl.refresh_on_read:
                self._tx.put(self._table, kg, primary, encode_timestamped(now, payload), secondary)
            yield decode_user_key(secondary), decode_value(payload)

    def keys(self, key: Key, namespace: str = "") -> list[str]:
        return [uk for uk, _v in self.entries(key, namespace)]

    def values(self, key: Key, namespace: str = "") -> list[Any]:
        return [v for _uk, v in self.entries(key, namespace)]

    def is_empty(self, key: Key, namespace: str = "") -> bool:
        kg, primary = self._locate(key, namespace)
        return next(self._live(kg, primary, self._tx.items_from(self._table, kg, primary, None)), None) is None

    def get_all(self, key: Key, namespace: str = "") -> dict[str, Any] | None:
        """The whole map, or ``None`` when it has no live entry."""
        return self._map_at(*self._locate(key, namespace)) or None
