"""The five keyed state kinds, with namespaces and TTL, over a partition transaction.

This is Flink's ``InternalKvState`` family plus its TTL decorators (``AbstractTtlDecorator``,
``TtlListState``, ``TtlMapState``), written once for every backend: the backends store
bytes (see ``codec``), the state kinds decide what the bytes mean.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Protocol

from statehouse.backends.base.transaction import PartitionTransaction
from statehouse.backends.codec import (
    decode_many,
    decode_user_key,
    decode_value,
    encode_timestamped,
    encode_user_key,
    encode_value,
    iter_timestamped,
    iter_values,
    split_timestamped,
)
from statehouse.backends.descriptors import StateDescriptor
from statehouse.backends.errors import InvalidValue, StateError, WrongStateKind
from statehouse.backends.functions import StateFunction
from statehouse.backends.limits import Limits
from statehouse.backends.ttl import Clock, TtlConfig, is_expired
from statehouse.backends.ttl_cleanup import IncrementalCleanup
from statehouse.backends.value_types import COERCE, coerce_many

Key = str | int
_NONE = type(None)


@dataclass(frozen=True, slots=True)
class Rows:
    """Many rows of one request, located: each row's key group and stored primary key (see
    ``Job.locate_many``). The ``*_many`` methods of the states take them, apply the same rules
    as the one-key methods, and read and write the transaction once per request."""

    key_groups: list[int]
    primaries: list[bytes]

    def __len__(self) -> int:
        return len(self.primaries)


def _each(rows: Sequence[Any], check: Callable[[Any], Any]) -> list[Any]:
    """``check`` over many values (in a C loop); a failure names its row."""
    try:
        return list(map(check, rows))
    except StateError:
        for row, value in enumerate(rows):  # find the row: only on the error path
            try:
                check(value)
            except StateError as exc:
                raise exc.within(f"row {row}", row=row) from None
        raise


class KeyedContext(Protocol):
    """What a state needs of its job (a ``Job``): the clock, the limits, where a key lives
    (which also refuses keys other replicas own), and the TTL state's incremental cleanup."""

    clock: Clock
    limits: Limits

    def locate(self, descriptor: StateDescriptor, key: Key, namespace: str) -> tuple[int, bytes]: ...

    @property
    def ttl_cleanup(self) -> IncrementalCleanup: ...


class KeyedState:
    """A registered state bound to one transaction; every call names its key and namespace."""

    def __init__(self, job: KeyedContext, tx: PartitionTransaction, descriptor: StateDescriptor) -> None:
        self._job = job
        self._tx = tx
        self.descriptor = descriptor
        self._table = descriptor.name
        self._ttl: TtlConfig | None = descriptor.ttl
        self._clock = job.clock
        self._limits = job.limits
        # Incremental TTL cleanup: what each access checks, fixed for the descriptor.
        self._cleanup_budget = self._ttl.cleanup_incremental_size if self._ttl is not None else 0
        self._cleaner = ttl_cleaner(descriptor) if self._cleanup_budget else None
        self._coerce = COERCE[descriptor.value_type] if descriptor.value_type is not None else None

    def _input(self, value: Any) -> Any:
        """A value given to the state, checked against its value type (if it has one)."""
        return value if self._coerce is None or value is None else self._coerce(value)

    def _inputs(self, values: Sequence[Any]) -> list[Any]:
        """:meth:`_input` of many values; a failure names its row."""
        value_type = self.descriptor.value_type
        if value_type is None:
            return list(values)
        checked = coerce_many(value_type, list(values))
        return checked if checked is not None else _each(values, self._input)

    def _locate(self, key: Key, namespace: str) -> tuple[int, bytes]:
        located = self._job.locate(self.descriptor, key, namespace)
        if self._cleaner is not None:
            self._job.ttl_cleanup.step(self._table, self._cleaner, self._cleanup_budget, self._tx, self._clock.now_ms())
        return located

    def accessed(self, rows: Rows) -> Rows:
        """Rows located for a request: as many TTL cleanup steps as one access per row takes."""
        if self._cleaner is not None and len(rows):
            budget = self._cleanup_budget * len(rows)
            self._job.ttl_cleanup.step(self._table, self._cleaner, budget, self._tx, self._clock.now_ms())
        return rows

    def clear(self, key: Key, namespace: str = "") -> None:
        kg, primary = self._locate(key, namespace)
        self._tx.clear(self._table, kg, primary)

    def clear_many(self, rows: Rows) -> None:
        self._tx.clear_many(self._table, rows.key_groups, rows.primaries)

    # -- single timestamped records (value, reducing, aggregating, one map entry) -----------

    def _read(self, kg: int, primary: bytes, secondary: bytes = b"", *, for_update: bool = False) -> Any:
        """Flink's read rule: expired → cleared, returned once only if visibility allows."""
        raw = self._tx.get(self._table, kg, primary, secondary)
        return None if raw is None else self._from_raw(raw, kg, primary, secondary, for_update)

    def _read_many(self, rows: Rows, secondaries: Sequence[bytes] | None = None, *, for_update: bool = False) -> list:
        """:meth:`_read` of many rows (map entries: one secondary per row)."""
        raws = self._tx.get_many(self._table, rows.key_groups, rows.primaries, secondaries)
        if self._ttl is None:
            return decode_many(raws)
        secs = secondaries if secondaries is not None else repeat(b"")
        return [
            None if raw is None else self._from_raw(raw, kg, primary, secondary, for_update)
            for raw, kg, primary, secondary in zip(raws, rows.key_groups, rows.primaries, secs, strict=False)
        ]

    def _from_raw(self, raw: bytes, kg: int, primary: bytes, secondary: bytes, for_update: bool) -> Any:
        ttl = self._ttl
        if ttl is None:
            return decode_value(raw)
        timestamp, payload = split_timestamped(raw)
        now = self._clock.now_ms()
        if is_expired(timestamp, ttl.ttl_ms, now):
            self._tx.delete(self._table, kg, primary, secondary)
            return decode_value(payload) if ttl.return_expired and not for_update else None
        if ttl.refresh_on_read and not for_update:
            self._tx.put(self._table, kg, primary, encode_timestamped(now, payload), secondary)
        return decode_value(payload)

    def _encode(self, value: Any) -> bytes:
        payload = encode_value(value)
        self._limits.check_value(payload)
        return payload

    def _user_key(self, user_key: str) -> bytes:
        encoded = encode_user_key(user_key)
        self._limits.check_key(encoded, "map user key")
        return encoded

    def _record(self, value: Any) -> bytes:
        payload = self._encode(value)
        return payload if self._ttl is None else encode_timestamped(self._clock.now_ms(), payload)

    def _write(self, kg: int, primary: bytes, value: Any, secondary: bytes = b"") -> None:
        self._tx.put(self._table, kg, primary, self._record(value), secondary)

    def _records_many(self, values: Sequence[Any]) -> list[bytes]:
        """:meth:`_record` of many values (``None`` stays ``None``: a row that deletes)."""
        payloads = _each(values, _encode_or_none)
        present = [p for p in payloads if p is not None] if None in values else payloads
        if present and max(map(len, present)) > self._limits.max_value_bytes:
            _each(payloads, self._check_payload)  # names the row
        if self._ttl is None:
            return payloads
        stamp = encode_timestamped(self._clock.now_ms(), b"")
        return [None if p is None else stamp + p for p in payloads]  # type: ignore[misc]

    def _check_payload(self, payload: bytes | None) -> None:
        if payload is not None:
            self._limits.check_value(payload)

    def _fold_many(
        self, rows: Rows, secondaries: Sequence[bytes] | None, values: Sequence[Any], function: StateFunction
    ) -> None:
        """Fold each row's value into its accumulator with ``function``, in row order (a key
        that comes back continues from its earlier rows), then write every accumulator once."""
        if _NONE in set(map(type, values)):
            row = list(values).index(None)
            raise InvalidValue(f"cannot add null to {self.descriptor.kind} state {self._table!r}").within(
                f"row {row}", row=row
            )
        values = self._inputs(values)
        accs = self._read_many(rows, secondaries, for_update=True)
        secs = secondaries if secondaries is not None else [b""] * len(rows)
        slots = list(zip(rows.key_groups, rows.primaries, secs, strict=True))
        try:
            if len(set(slots)) == len(slots):  # every key once: one add per row, maybe vectorized
                kgs, primaries, results = rows.key_groups, rows.primaries, function.add_each(accs, values)
            else:
                folded: dict[tuple[int, bytes, bytes], Any] = {}
                add, current = function.add, folded.get
                for slot, acc, value in zip(slots, accs, values, strict=True):
                    folded[slot] = add(current(slot, acc), value)
                kgs, primaries, secs = (list(column) for column in zip(*folded, strict=True))
                results = list(folded.values())
        except StateError:
            for row, (acc, value) in enumerate(zip(accs, values, strict=True)):  # find the row: error path only
                try:
                    function.add(acc, value)
                except StateError as exc:
                    raise exc.within(f"row {row}", row=row) from None
            raise
        records = self._records_many(results)
        self._tx.put_many(self._table, kgs, primaries, records, secs if secondaries is not None else None)


class ValueState(KeyedState):
    def get(self, key: Key, namespace: str = "") -> Any:
        value = self._read(*self._locate(key, namespace))
        return self.descriptor.default if value is None else value

    def update(self, key: Key, value: Any, namespace: str = "") -> None:
        """``update(None)`` clears, as in Flink."""
        kg, primary = self._locate(key, namespace)
        if value is None:
            self._tx.clear(self._table, kg, primary)
        else:
            self._write(kg, primary, self._input(value))

    def get_many(self, rows: Rows) -> list[Any]:
        values = self._read_many(rows)
        default = self.descriptor.default
        return values if default is None else [default if v is None else v for v in values]

    def update_many(self, rows: Rows, values: Sequence[Any]) -> None:
        """:meth:`update` per row, in order (a null value clears)."""
        records = self._records_many(self._inputs(values))
        self._tx.put_many(self._table, rows.key_groups, rows.primaries, records)


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
        kg, primary = self._locate(key, namespace)
        raw = self._tx.get(self._table, kg, primary)
        return None if raw is None else self._from_list(raw, kg, primary)

    def get_many(self, rows: Rows) -> list[list[Any] | None]:
        raws = self._tx.get_many(self._table, rows.key_groups, rows.primaries)
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
            self._tx.clear(self._table, kg, primary)
        elif ttl.refresh_on_read:
            self._tx.put(self._table, kg, primary, self._records(unexpired))
        if ttl.return_expired:
            return [v for _ts, v in stored]
        return unexpired or None

    def add(self, key: Key, value: Any, namespace: str = "") -> None:
        self.add_all(key, [value], namespace)

    def add_all(self, key: Key, values: Iterable[Any], namespace: str = "") -> None:
        elements = _check_elements(values, self._coerce)
        kg, primary = self._locate(key, namespace)
        if not elements:
            return
        existing = self._tx.get(self._table, kg, primary) or b""
        self._tx.put(self._table, kg, primary, existing + self._records(elements))

    def add_many(self, rows: Rows, elements: Sequence[list[Any]]) -> None:
        """:meth:`add_all` per row, in order: each row appends its elements."""
        records = _each(elements, lambda values: self._records(_check_elements(values, self._coerce)))
        existing = self._tx.get_many(self._table, rows.key_groups, rows.primaries)
        lists: dict[tuple[int, bytes], bytes] = {}
        for kg, primary, stored, appended in zip(rows.key_groups, rows.primaries, existing, records, strict=False):
            if appended:
                slot = (kg, primary)
                lists[slot] = (lists.get(slot, stored or b"")) + appended
        kgs, primaries = zip(*lists, strict=False) if lists else ((), ())
        self._tx.put_many(self._table, kgs, primaries, list(lists.values()))

    def update_many(self, rows: Rows, lists: Sequence[list[Any]]) -> None:
        """:meth:`update` per row, in order (an empty list clears)."""
        records = _each(lists, lambda values: self._records(_check_elements(values, self._coerce)) or None)
        self._tx.put_many(self._table, rows.key_groups, rows.primaries, records)

    def update(self, key: Key, values: Iterable[Any], namespace: str = "") -> None:
        elements = _check_elements(values, self._coerce)
        kg, primary = self._locate(key, namespace)
        if elements:
            self._tx.put(self._table, kg, primary, self._records(elements))
        else:
            self._tx.clear(self._table, kg, primary)


class MapState(KeyedState):
    """Each entry is its own record with its own TTL timestamp (Flink's ``TtlMapState``)."""

    def get(self, key: Key, user_key: str, namespace: str = "") -> Any:
        kg, primary = self._locate(key, namespace)
        return self._read(kg, primary, self._user_key(user_key))

    def contains(self, key: Key, user_key: str, namespace: str = "") -> bool:
        return self.get(key, user_key, namespace) is not None

    def put(self, key: Key, user_key: str, value: Any, namespace: str = "") -> None:
        self.put_all(key, {user_key: value}, namespace)

    def put_all(self, key: Key, entries: Mapping[str, Any], namespace: str = "") -> None:
        encoded = self._entries_in(entries)
        kg, primary = self._locate(key, namespace)
        for secondary, value in encoded:
            self._write(kg, primary, value, secondary)

    def _entries_in(self, entries: Mapping[str, Any]) -> list[tuple[bytes, Any]]:
        encoded = [(self._user_key(uk), self._input(v)) for uk, v in entries.items()]
        if any(v is None for _uk, v in encoded):
            raise InvalidValue("map values must not be null; remove the entry instead")
        return encoded

    def get_entries_many(self, rows: Rows, user_keys: Sequence[str]) -> list[Any]:
        """:meth:`get` per row: one entry each."""
        return self._read_many(rows, _each(user_keys, self._user_key))

    def put_entries_many(self, rows: Rows, user_keys: Sequence[str], values: Sequence[Any]) -> None:
        """:meth:`put` per row, in order."""

        if None in values:
            row = list(values).index(None)
            raise InvalidValue(f"row {row}: map values must not be null; remove the entry instead", row=row)
        secondaries = _each(user_keys, self._user_key)
        records = self._records_many(self._inputs(values))
        self._tx.put_many(self._table, rows.key_groups, rows.primaries, records, secondaries)

    def add_entries_many(self, rows: Rows, user_keys: Sequence[str], values: Sequence[Any]) -> None:
        """:meth:`add` per row, in order."""
        function = self._add_function()
        self._fold_many(rows, _each(user_keys, self._user_key), values, function)

    def remove_many(self, rows: Rows, user_keys: Sequence[str]) -> None:
        secondaries = _each(user_keys, self._user_key)
        self._tx.put_many(self._table, rows.key_groups, rows.primaries, [None] * len(secondaries), secondaries)

    def get_many(self, rows: Rows) -> list[dict[str, Any] | None]:
        """:meth:`get_all` per row: whole maps."""
        return [
            dict(self._entries_at(kg, primary)) or None
            for kg, primary in zip(rows.key_groups, rows.primaries, strict=True)
        ]

    def update_many(self, rows: Rows, maps: Sequence[Mapping[str, Any]]) -> None:
        """:meth:`update` per row, in order: each row replaces its key's whole map."""
        entries = _each(maps, self._entries_in)
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
        function = self._add_function()
        secondary = self._user_key(user_key)
        kg, primary = self._locate(key, namespace)
        elements = list(values)
        if any(v is None for v in elements):
            raise InvalidValue(f"cannot add null to an entry of map state {self._table!r}")
        elements = [self._input(v) for v in elements]
        if not elements:
            return
        acc = self._read(kg, primary, secondary, for_update=True)
        for value in elements:
            acc = function.add(acc, value)
        self._write(kg, primary, acc, secondary)

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
        encoded = self._entries_in(entries)
        kg, primary = self._locate(key, namespace)
        self._tx.clear(self._table, kg, primary)
        for secondary, value in encoded:
            self._write(kg, primary, value, secondary)

    def remove(self, key: Key, user_key: str, namespace: str = "") -> None:
        kg, primary = self._locate(key, namespace)
        self._tx.delete(self._table, kg, primary, self._user_key(user_key))

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


class ReducingState(KeyedState):
    """Reducing and aggregating state: ``add`` folds values into an accumulator.

    An expired accumulator is never folded into (Flink's ``TtlReduceFunction``/
    ``TtlAggregateFunction`` discard it), whatever the visibility.
    """

    def get(self, key: Key, namespace: str = "") -> Any:
        acc = self._read(*self._locate(key, namespace))
        return None if acc is None else self.descriptor.state_function.result(acc)

    def add(self, key: Key, value: Any, namespace: str = "") -> None:
        self.add_all(key, [value], namespace)

    def add_all(self, key: Key, values: Iterable[Any], namespace: str = "") -> None:
        kg, primary = self._locate(key, namespace)
        function = self.descriptor.state_function
        acc = self._read(kg, primary, for_update=True)
        for value in values:
            if value is None:
                raise InvalidValue(f"cannot add null to {self.descriptor.kind} state {self._table!r}")
            acc = function.add(acc, self._input(value))
        if acc is not None:
            self._write(kg, primary, acc)

    def get_many(self, rows: Rows) -> list[Any]:
        result = self.descriptor.state_function.result
        return [None if acc is None else result(acc) for acc in self._read_many(rows)]

    def add_many(self, rows: Rows, values: Sequence[Any]) -> None:
        """:meth:`add` per row, in order."""
        self._fold_many(rows, None, values, self.descriptor.state_function)


class AggregatingState(ReducingState):
    pass


STATE_CLASSES: dict[str, type[KeyedState]] = {
    "value": ValueState,
    "list": ListState,
    "map": MapState,
    "reducing": ReducingState,
    "aggregating": AggregatingState,
}


def _encode_or_none(value: Any) -> bytes | None:
    return None if value is None else encode_value(value)


def ttl_cleaner(descriptor: StateDescriptor) -> Callable[[bytes, int], bytes | None] | None:
    """How to drop expired data from one stored record, or ``None`` without TTL.

    Used by full snapshots (Flink's ``cleanupFullSnapshot``) and by incremental cleanup.
    Returns the record unchanged, a shorter list, or ``None`` when nothing is left.
    """
    ttl = descriptor.ttl
    if ttl is None:
        return None
    ttl_ms = ttl.ttl_ms
    if descriptor.kind != "list":

        def clean_record(raw: bytes, now: int) -> bytes | None:
            return None if is_expired(split_timestamped(raw)[0], ttl_ms, now) else raw

        return clean_record

    def clean_list(raw: bytes, now: int) -> bytes | None:
        stored = list(iter_timestamped(raw))
        kept = [(ts, v) for ts, v in stored if not is_expired(ts, ttl_ms, now)]
        if len(kept) == len(stored):
            return raw
        return b"".join(encode_timestamped(ts, encode_value(v)) for ts, v in kept) or None

    return clean_list
