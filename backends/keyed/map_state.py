"""Flink's ``MapState``: each entry its own record with its own TTL timestamp; with a function,
``map_add`` folds into one entry."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from statehouse.backends.codec import (
    decode_user_key,
    decode_value,
    encode_timestamped,
    split_timestamped,
)
from statehouse.backends.errors import InvalidValue, WrongStateKind
from statehouse.backends.functions import StateFunction
from statehouse.backends.keyed.base import Key, KeyedState, Rows, each_row, one_key
from statehouse.backends.ttl import is_expired


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

    def get_entries_many(self, rows: Rows, user_keys: Sequence[str]) -> list[Any]:
        """:meth:`get` per row: one entry each."""
        return self._read_many(rows, each_row(user_keys, self._user_key))

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
        return [
            dict(self._entries_at(kg, primary)) or None
            for kg, primary in zip(rows.key_groups, rows.primaries, strict=True)
        ]

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
        ttl = self._ttl
        stored = list(self._tx.items(self._table, kg, primary))
        if ttl is None:
            return [(decode_user_key(s), decode_value(v)) for s, v in stored]
        now = self._clock.now_ms()
        result = []
        for secondary, raw in stored:
            timestamp, payload = split_timestamped(raw)
            if is_expired(timestamp, ttl.ttl_ms, now):
                self._tx.delete(self._table, kg, primary, secondary)
                if not ttl.return_expired:
                    continue
            elif ttl.refresh_on_read:
                self._tx.put(self._table, kg, primary, encode_timestamped(now, payload), secondary)
            result.append((decode_user_key(secondary), decode_value(payload)))
        return result

    def keys(self, key: Key, namespace: str = "") -> list[str]:
        return [uk for uk, _v in self.entries(key, namespace)]

    def values(self, key: Key, namespace: str = "") -> list[Any]:
        return [v for _uk, v in self.entries(key, namespace)]

    def is_empty(self, key: Key, namespace: str = "") -> bool:
        return not self.entries(key, namespace)

    def get_all(self, key: Key, namespace: str = "") -> dict[str, Any] | None:
        """The whole map, or ``None`` when it has no live entry."""
        return dict(self.entries(key, namespace)) or None
