"""Flink's ``ReducingState`` and ``AggregatingState``: ``add`` folds into an accumulator with a
built-in function."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from statehouse.backends.keyed.base import Key, KeyedState, Rows, one_key
from statehouse.protocol.errors import InvalidArgument

# An add_get of no value would answer a read: refused, so that what it answers is always a fold.
NOTHING_TO_ADD_GET = "'add_get' adds at least one value and answers the result after it; read with 'get' instead"


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
        return self.descriptor.state_function.results(self._read_many(rows))

    def add_get(self, key: Key, value: Any, namespace: str = "") -> Any:
        """:meth:`add`, answering the result after it (what :meth:`get` would read next)."""
        return one_key(lambda: self.add_get_many(self._row(key, namespace), [value]))[0]

    def add_get_all(self, key: Key, values: Iterable[Any], namespace: str = "") -> Any:
        """:meth:`add_all`, answering the result after the last value (at least one)."""
        elements = list(values)
        if not elements:
            raise InvalidArgument(NOTHING_TO_ADD_GET)
        return one_key(lambda: self.add_get_many(self._row(key, namespace, len(elements)), elements))[-1]

    def add_many(self, rows: Rows, values: Sequence[Any]) -> None:
        """:meth:`add` per row, in order."""
        self._fold_many(rows, None, values, self.descriptor.state_function)

    def add_get_many(self, rows: Rows, values: Sequence[Any]) -> list[Any]:
        """:meth:`add_many`, answering each row's result after its own add (a key that comes
        back answers its running result): one read of each accumulator serves the fold and
        the answer."""
        function = self.descriptor.state_function
        accs = self._fold_many(rows, None, values, function, answer=True)
        assert accs is not None  # answer=True always answers
        return function.results(accs)


class AggregatingState(ReducingState):
    pass
