"""Incremental TTL cleanup (Flink's ``TtlIncrementalCleanup``) of one job.

Per TTL state, a lazy cursor over all its entries that wraps around; every access to the
state checks the next few entries and drops what expired. The cursors live with the job
(they outlast transactions); the writes go into the accessing transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from statehouse.backends.base.partition import StorePartition
from statehouse.backends.base.transaction import PartitionTransaction
from statehouse.protocol.keygroups import KeyGroupRange

Cleaner = Callable[[bytes, int], bytes | None]  # stored value, now -> value to keep, or None if expired


class IncrementalCleanup:
    """One job's incremental TTL cleanup (Flink's ``TtlIncrementalCleanup``): it owns a wrapping
    cursor per TTL state over the partition's entries, and each access to a state steps its
    cursor a few entries, dropping the expired ones in the accessing transaction."""

    def __init__(self, partition: StorePartition, key_group_range: KeyGroupRange) -> None:
        self._partition = partition
        self._range = key_group_range
        self._cursors: dict[str, Iterator[tuple[int, bytes, bytes]]] = {}

    def step(self, state: str, clean: Cleaner, budget: int, tx: PartitionTransaction, now_ms: int) -> None:
        """Check the next ``budget`` entries of ``state``; drop or rewrite the expired ones in ``tx``."""
        checked = 0
        restarted = False
        while checked < budget:
            cursor = self._cursors.get(state)
            if cursor is None:
                if restarted:
                    return  # the state is empty
                cursor = self._cursors[state] = self._all_entries(state)
                restarted = True
            entry = next(cursor, None)
            if entry is None:
                del self._cursors[state]
                continue
            kg, primary, secondary = entry
            checked += 1
            raw = tx.get(state, kg, primary, secondary)
            if raw is None:
                continue
            cleaned = clean(raw, now_ms)
            if cleaned is None:
                tx.delete_expired(state, kg, primary, secondary)
            elif cleaned is not raw:
                tx.put_cleaned(state, kg, primary, cleaned, secondary)

    def _all_entries(self, state: str) -> Iterator[tuple[int, bytes, bytes]]:
        for kg in self._range:
            for primary, secondary, _value in self._partition.scan(state, kg):
                yield kg, primary, secondary

    def forget(self, state: str) -> None:
        """A dropped state: its cursor goes."""
        self._cursors.pop(state, None)

    def clear(self) -> None:
        """Drop every cursor (their iterators may keep the storage open)."""
        self._cursors.clear()
