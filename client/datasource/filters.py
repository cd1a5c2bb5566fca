"""What the keyed readers share, live or from a checkpoint: the filters they push down, how keys
and key-group ranges become input partitions, and how many rows a batch holds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

from statehouse.protocol.keygroups import KeyGroupRange, assign_to_key_group

PAGE_ROWS = 10_000  # rows per page of a live scan, and per batch of a checkpoint read


class KeyFilterPushdown:
    """What a keyed read takes of Spark's filters, live or from a checkpoint: ``key = / IN`` keeps
    those keys (point reads), ``key_group`` comparisons narrow the key groups read; the rest
    Spark applies itself. Readers set ``first``, ``last`` (every key group) and ``keys`` (None)."""

    first: int
    last: int
    keys: set[Any] | None

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            column = getattr(f, "attribute", None)  # every filter but Not names its column
            if column == ("key",) and isinstance(f, EqualTo | In):
                wanted = {f.value} if isinstance(f, EqualTo) else set(f.value)
                self.keys = wanted if self.keys is None else self.keys & wanted
            elif column == ("key_group",) and isinstance(f, EqualTo | GreaterThan | GreaterThanOrEqual):
                low = f.value + 1 if isinstance(f, GreaterThan) else f.value
                self.first = max(self.first, low)
                if isinstance(f, EqualTo):
                    self.last = min(self.last, f.value)
            elif column == ("key_group",) and isinstance(f, LessThan | LessThanOrEqual):
                self.last = min(self.last, f.value - 1 if isinstance(f, LessThan) else f.value)
            else:
                yield f


def key_groups_of(
    keys: Iterable[Any], key_type: str, max_parallelism: int, first: int, last: int
) -> dict[int, list[Any]]:
    """The keys by key group, those in ``first..last`` only (a key not of the state's type has no row)."""
    found: dict[int, list[Any]] = {}
    for key in sorted(keys, key=repr):
        try:
            group = assign_to_key_group(key, key_type, max_parallelism)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if first <= group <= last:
            found.setdefault(group, []).append(key)
    return found


def split_range(start: int, end: int, splits: int) -> list[tuple[int, int]]:
    """``start..end`` in up to ``splits`` even sub-ranges."""
    count = min(splits, end - start + 1)
    ranges = (KeyGroupRange.for_operator(end - start + 1, count, i) for i in range(count))
    return [(start + r.start, start + r.end) for r in ranges]
