"""Flink's ``ValueState``: one value per key and namespace (``update(None)`` clears)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from statehouse.backends.keyed.base import Key, KeyedState, Rows, one_key


class ValueState(KeyedState):
    """Flink's ``ValueState``: one value per key and namespace, read as the descriptor's default
    when absent; one record per row in the state's table, written whole by every update."""

    def get(self, key: Key, namespace: str = "") -> Any:
        return self.get_many(self._row(key, namespace))[0]

    def update(self, key: Key, value: Any, namespace: str = "") -> None:
        """``update(None)`` clears, as in Flink."""
        one_key(lambda: self.update_many(self._row(key, namespace), [value]))

    def get_many(self, rows: Rows) -> list[Any]:
        values = self._read_many(rows)
        default = self.descriptor.default
        return values if default is None else [default if v is None else v for v in values]

    def update_many(self, rows: Rows, values: Sequence[Any]) -> None:
        """:meth:`update` per row, in order (a null value clears)."""
        records = self._records_many(self._inputs(values))
        self._tx.put_many(self._table, rows.key_groups, rows.primaries, records)

    # A columnar put whose value column has the state's type packs the whole column at once,
    # and a columnar get of a typed state unpacks it (``backends/columnar_codec.py``); these
    # are the rest of the rules for them.

    def update_payloads(
        self, rows: Rows, payloads: list[bytes | None], longest: int | None = None, deletes: bool | None = None
    ) -> None:
        """:meth:`update_many` of values already checked against the value type and packed
        (``codec.pack_value``; ``None`` clears); ``longest`` and ``deletes`` as ``_records_of`` takes them."""
        records = self._records_of(payloads, longest, deletes)
        self._tx.put_many(self._table, rows.key_groups, rows.primaries, records, deletes=deletes)

    def get_payloads(self, rows: Rows) -> list[bytes | None] | None:
        """:meth:`get_many` as the values' msgpack bytes; ``None`` (nothing read) when the state
        has a default, which absent rows read as."""
        return self._payloads_many(rows) if self.descriptor.default is None else None
