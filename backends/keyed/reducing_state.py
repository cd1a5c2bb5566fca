"""Flink's ``ReducingState`` and ``AggregatingState``: ``add`` folds into an accumulator with a
built-in function."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from statehouse.backends.keyed.base import Key, KeyedState, Rows, one_key


class ReducingState(KeyedState):
    """Reducing and aggregating state: ``add`` folds values into an accumulator.

    An expired accumulator is never folded into (Flink's ``TtlReduceFunction``/
    ``TtlAggregateFunction`` discard it), whatever the visibility.
    """

    def get(self, key: Key, namespace: str = "") -> Any:
        return self.get_many(self._row(key, namespace))[0]

    def add(self, key: Key, value: Any, namespace: str = "") -> None:
        self.add_all(key, [value], namespace)

    def add_all(self, key: Key, values: Iterable[Any], namespace: str = "") -> None:
        elements = list(values)
        one_key(lambda: self.add_many(self._row(key, namespace, len(elements)), elements))

    def get_many(self, rows: Rows) -> list[Any]:
        result = self.descriptor.state_function.result
        return [None if acc is None else result(acc) for acc in self._read_many(rows)]

    def add_many(self, rows: Rows, values: Sequence[Any]) -> None:
        """:meth:`add` per row, in order."""
        self._fold_many(rows, None, values, self.descriptor.state_function)


class AggregatingState(ReducingState):
    pass
