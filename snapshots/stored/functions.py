"""Built-in reduce and aggregate functions, chosen by name in a state descriptor.

No user code runs on the server, so reducing and aggregating states pick one of these.
Each function is an accumulator machine: ``add(acc, value)`` folds one input into the
accumulator (``acc is None`` before the first input) and ``result(acc)`` is what a read
returns. For reducing functions the accumulator is the result (Flink's ``ReduceFunction``);
aggregating functions may have an accumulator, input and output of different types
(Flink's ``AggregateFunction``). A map state may name one of ``MAP_FUNCTIONS`` to fold values
into single entries (``map_add``); there the accumulator may also have been written by
``map_put``, so functions check it as well as the input.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from statehouse.protocol.errors import InvalidValue


def _number(function: str, value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidValue(f"function {function!r} adds numbers; got {type(value).__name__} {value!r}")
    return value


def _stored_number(function: str, acc: Any, accepted: str = "a number") -> int | float:
    """The accumulator so far; a map entry may hold anything ``map_put`` wrote."""
    if isinstance(acc, bool) or not isinstance(acc, int | float):
        raise InvalidValue(
            f"function {function!r} cannot fold into the stored {type(acc).__name__} {acc!r}; "
            f"put {accepted} there or remove the entry first"
        )
    return acc


def _comparable(function: str, acc: Any, value: Any) -> Any:
    """min/max accept numbers or strings, but never a mix of the two."""
    if acc is not None and not isinstance(acc, str):
        _stored_number(function, acc, "a number or a string")
    if isinstance(value, str):
        if acc is not None and not isinstance(acc, str):
            raise InvalidValue(f"function {function!r} cannot compare string {value!r} with a number")
        return value
    value = _number(function, value)
    if acc is not None and isinstance(acc, str):
        raise InvalidValue(f"function {function!r} cannot compare number {value!r} with a string")
    return value


class StateFunction(ABC):
    """A reducing or aggregating state's function (Flink's ``ReduceFunction`` and
    ``AggregateFunction``, chosen by name): how a value folds into the accumulator, and what the
    state answers for an accumulator."""

    name: str
    description: str

    @abstractmethod
    def add(self, acc: Any | None, value: Any) -> Any: ...

    def add_each(self, accs: list[Any], values: list[Any]) -> list[Any]:
        """``add`` row by row (accumulator ``accs[i]``, input ``values[i]``): a columnar request."""
        return list(map(self.add, accs, values))

    def result(self, acc: Any) -> Any:
        return acc

    def results(self, accs: list[Any]) -> list[Any]:
        """``result`` of each accumulator (``None``: absent, answered as it is), for a columnar
        answer; a function whose result is its accumulator answers the list itself."""
        if type(self).result is StateFunction.result:
            return accs
        result = self.result
        return [None if acc is None else result(acc) for acc in accs]


def _all_numbers(values: list[Any], absent_too: bool = False) -> bool:
    """Every value an int or a float (bool is neither here), checked in C loops."""
    kinds = set(map(type, values))
    if absent_too:
        kinds.discard(type(None))
    return kinds <= _NUMBER_TYPES


_NUMBER_TYPES = frozenset({int, float})


class Sum(StateFunction):
    name, description = "sum", "sum of numbers"

    def add(self, acc: Any | None, value: Any) -> Any:
        value = _number(self.name, value)
        return value if acc is None else _stored_number(self.name, acc) + value

    def add_each(self, accs: list[Any], values: list[Any]) -> list[Any]:
        if _all_numbers(values) and _all_numbers(accs, absent_too=True):  # what add checks, once
            return [v if a is None else a + v for a, v in zip(accs, values, strict=True)]
        return super().add_each(accs, values)


class Min(StateFunction):
    name, description = "min", "smallest number or string"

    def add(self, acc: Any | None, value: Any) -> Any:
        value = _comparable(self.name, acc, value)
        return value if acc is None or value < acc else acc


class Max(StateFunction):
    name, description = "max", "largest number or string"

    def add(self, acc: Any | None, value: Any) -> Any:
        value = _comparable(self.name, acc, value)
        return value if acc is None or value > acc else acc


class Count(StateFunction):
    name, description = "count", "number of values added"

    def add(self, acc: Any | None, value: Any) -> Any:
        return 1 if acc is None else _stored_number(self.name, acc) + 1

    def add_each(self, accs: list[Any], values: list[Any]) -> list[Any]:
        if _all_numbers(accs, absent_too=True):
            return [1 if a is None else a + 1 for a in accs]
        return super().add_each(accs, values)


class First(StateFunction):
    name, description = "first", "the first value added"

    def add(self, acc: Any | None, value: Any) -> Any:
        return value if acc is None else acc


class Last(StateFunction):
    name, description = "last", "the latest value added"

    def add(self, acc: Any | None, value: Any) -> Any:
        return value


class Avg(StateFunction):
    """Accumulator ``[sum, count]``, result the mean (a float)."""

    name, description = "avg", "mean of numbers"

    def add(self, acc: Any | None, value: Any) -> Any:
        value = _number(self.name, value)
        if acc is None:
            return [value, 1]
        return [acc[0] + value, acc[1] + 1]

    def result(self, acc: Any) -> Any:
        return acc[0] / acc[1]


class Summary(StateFunction):
    """Accumulator ``[count, sum, min, max]``, result an object with the mean as well."""

    name, description = "summary", "count, sum, min, max and mean of numbers"

    def add(self, acc: Any | None, value: Any) -> Any:
        value = _number(self.name, value)
        if acc is None:
            return [1, value, value, value]
        count, total, low, high = acc
        return [count + 1, total + value, min(low, value), max(high, value)]

    def result(self, acc: Any) -> Any:
        count, total, low, high = acc
        return {"count": count, "sum": total, "min": low, "max": high, "avg": total / count}


def _by_name(*functions: StateFunction) -> dict[str, StateFunction]:
    return {f.name: f for f in functions}


REDUCE_FUNCTIONS = _by_name(Sum(), Min(), Max(), Count(), First(), Last())
AGGREGATE_FUNCTIONS = _by_name(Avg(), Count(), Sum(), Min(), Max(), Summary())
# A map entry is read back as stored (map_get has no result step), so a map takes only the
# reducing functions whose accumulator is their result.
MAP_FUNCTIONS = {name: f for name, f in REDUCE_FUNCTIONS.items() if type(f).result is StateFunction.result}
