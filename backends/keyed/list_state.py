"""Flink's ``ListState``: each element its own record, so TTL applies per element."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from statehouse.backends.keyed.base import Key, KeyedState, Rows, each_row, one_key
from statehouse.protocol.errors import InvalidValue
from statehouse.snapshots.stored.codec import encode_timestamped, iter_timestamped, iter_values
from statehouse.snapshots.stored.ttl import is_expired


def _check_elements(values: Iterable[Any], coerce: Callable[[Any], Any] | None) -> list[Any]:
    elements = list(values)
    if any(v is None for v in elements):
        raise InvalidValue("list elements must not be null (Flink's ListState refuses null)")
    return elements if coerce is None else [coerce(v) for v in elements]


class ListState(KeyedState):
    """Each element is its own record, so TTL applies per element (Flink's ``TtlListState``)."""

    def _records(self, elements: list[Any]) -> bytes:
        if self._ttl is None:
            return b"".join(self._encode(v) for v in elements)
        now = self._clock.now_ms()
        return b"".join(encode_timestamped(now, self._encode(v)) for v in elements)

    def get(self, key: Key, namespace: str = "") -> list[Any] | None:
        return self.get_many(self._row(key, namespace))[0]

    def get_many(self, rows: Rows) -> list[list[Any] | None]:
        if self._ttl is not None:  # a read may clear or rewrite the list: later rows must see it
            found = []
            for kg, primary in zip(rows.key_groups, rows.primaries, strict=True):
                raw = self._tx.get(self._table, kg, primary)
                if raw is not None:
                    self._answer.charge(len(raw))
                found.append(None if raw is None else self._from_list(raw, kg, primary))
            return found
        raws = self._answer.read_many(
            lambda budget: self._tx.get_many(self._table, rows.key_groups, rows.primaries, None, budget)
        )
        return [
            None if raw is None else self._from_list(raw, kg, primary)
            for raw, kg, primary in zip(raws, rows.key_groups, rows.primaries, strict=False)
        ]

    def _from_list(self, raw: bytes, kg: int, primary: bytes) -> list[Any] | None:
        ttl = self._ttl
        if ttl is None:
            return list(iter_values(raw))
        now = self._clock.now_ms()
        stored = list(iter_timestamped(raw))
        unexpired = [v for ts, v in stored if not is_expired(ts, ttl.ttl_ms, now)]
        if not unexpired:
            self._tx.delete_expired(self._table, kg, primary)
        elif ttl.refresh_on_read:
            self._tx.put(self._table, kg, primary, self._records(unexpired))
        if ttl.return_expired:
            return [v for _ts, v in stored]
        return unexpired or None

    def add(self, key: Key, value: Any, namespace: str = "") -> None:
        self.add_all(key, [value], namespace)

    def add_all(self, key: Key, values: Iterable[Any], namespace: str = "") -> None:
        one_key(lambda: self.add_many(self._row(key, namespace), [list(values)]))

    def add_many(self, rows: Rows, elements: Sequence[list[Any]]) -> None:
        """:meth:`add_all` per row, in order: each row appends its elements."""
        records = each_row(elements, lambda values: self._records(_check_elements(values, self._coerce)))
        existing = self._tx.get_many(self._table, rows.key_groups, rows.primaries)
        lists: dict[tuple[int, bytes], bytes] = {}
        for row, (kg, primary, stored, appended) in enumerate(
            zip(rows.key_groups, rows.primaries, existing, records, strict=False)
        ):
            if appended:
                slot = (kg, primary)
                grown = lists[slot] = (lists.get(slot, stored or b"")) + appended
                if len(grown) > self._limits.max_list_bytes:
                    raise self._limits.list_error(len(grown)).within(f"row {row}", row=row)
        kgs, primaries = zip(*lists, strict=False) if lists else ((), ())
        self._tx.put_many(self._table, kgs, primaries, list(lists.values()))

    def update_many(self, rows: Rows, lists: Sequence[list[Any]]) -> None:
        """:meth:`update` per row, in order (an empty list clears)."""
        records = each_row(lists, lambda values: self._records(_check_elements(values, self._coerce)) or None)
        each_row([len(r) if r else 0 for r in records], self._limits.check_list)
        self._tx.put_many(self._table, rows.key_groups, rows.primaries, records)

    def update(self, key: Key, values: Iterable[Any], namespace: str = "") -> None:
        one_key(lambda: self.update_many(self._row(key, namespace), [list(values)]))
