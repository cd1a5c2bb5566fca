"""The five keyed state kinds, with namespaces and TTL, over a partition transaction.

This is Flink's ``InternalKvState`` family plus its TTL decorators (``AbstractTtlDecorator``,
``TtlListState``, ``TtlMapState``), written once for every backend: the backends store
bytes (see ``codec``), the state kinds decide what the bytes mean.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from statehouse.backends.base.transaction import PartitionTransaction
from statehouse.backends.codec import (
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
from statehouse.backends.errors import InvalidValue, WrongStateKind
from statehouse.backends.functions import StateFunction
from statehouse.backends.limits import Limits
from statehouse.backends.ttl import Clock, TtlConfig, is_expired
from statehouse.backends.ttl_cleanup import IncrementalCleanup

Key = str | int


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

    def _locate(self, key: Key, namespace: str) -> tuple[int, bytes]:
        located = self._job.locate(self.descriptor, key, namespace)
        if self._cleaner is not None:
            self._job.ttl_cleanup.step(self._table, self._cleaner, self._cleanup_budget, self._tx, self._clock.now_ms())
        return located

    def clear(self, key: Key, namespace: str = "") -> None:
        kg, primary = self._locate(key, namespace)
        self._tx.clear(self._table, kg, primary)

    # -- single timestamped records (value, reducing, aggregating, one map entry) -----------

    def _read(self, kg: int, primary: bytes, secondary: bytes = b"", *, for_update: bool = False) -> Any:
        """Flink's read rule: expired → cleared, returned once only if visibility allows."""
        raw = self._tx.get(self._table, kg, primary, secondary)
        if raw is None:
            return None
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
            self._write(kg, primary, value)


def _check_elements(values: Iterable[Any]) -> list[Any]:
    elements = list(values)
    if any(v is None for v in elements):
        raise InvalidValue("list elements must not be null (Flink's ListState refuses null)")
    return elements


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
        if raw is None:
            return None
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
        elements = _check_elements(values)
        kg, primary = self._locate(key, namespace)
        if not elements:
            return
        existing = self._tx.get(self._table, kg, primary) or b""
        self._tx.put(self._table, kg, primary, existing + self._records(elements))

    def update(self, key: Key, values: Iterable[Any], namespace: str = "") -> None:
        elements = _check_elements(values)
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
        encoded = [(self._user_key(uk), v) for uk, v in entries.items()]
        if any(v is None for _uk, v in encoded):
            raise InvalidValue("map values must not be null; remove the entry instead")
        kg, primary = self._locate(key, namespace)
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
        kg, primary = self._locate(key, namespace)
        self._tx.clear(self._table, kg, primary)
        self.put_all(key, entries, namespace)

    def remove(self, key: Key, user_key: str, namespace: str = "") -> None:
        kg, primary = self._locate(key, namespace)
        self._tx.delete(self._table, kg, primary, self._user_key(user_key))

    def entries(self, key: Key, namespace: str = "") -> list[tuple[str, Any]]:
        """All live entries in user-key byte order; iteration applies the TTL rules per entry."""
        kg, primary = self._locate(key, namespace)
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
            acc = function.add(acc, value)
        if acc is not None:
            self._write(kg, primary, acc)


class AggregatingState(ReducingState):
    pass


STATE_CLASSES: dict[str, type[KeyedState]] = {
    "value": ValueState,
    "list": ListState,
    "map": MapState,
    "reducing": ReducingState,
    "aggregating": AggregatingState,
}


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
