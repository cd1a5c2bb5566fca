"""What every keyed state kind shares: rows located for a request, the context a state needs of
its job, and the single-record rules (Flink's read rule with TTL, encoding, limits, folding)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any, Protocol, TypeVar

from statehouse.backends.base.transaction import PartitionTransaction
from statehouse.backends.columnar_codec import pack_numbers
from statehouse.backends.errors import StateError
from statehouse.backends.keyed.cleaner import ttl_cleaner
from statehouse.backends.keyspace import KeySpace, Rows
from statehouse.backends.limits import AnswerMeter, Limits
from statehouse.backends.ttl import Clock
from statehouse.backends.ttl_cleanup import IncrementalCleanup
from statehouse.protocol.errors import InvalidValue
from statehouse.snapshots.stored.codec import (
    all_plain,
    check_value,
    decode_many,
    decode_value,
    encode_timestamped,
    encode_user_key,
    encode_value,
    pack_value,
    split_timestamped,
)
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.functions import StateFunction
from statehouse.snapshots.stored.ttl import TtlConfig, is_expired
from statehouse.snapshots.stored.value_types import COERCE, coerce_many

Key = str | int
T = TypeVar("T")
NONE_TYPE = type(None)


def one_key(run: Callable[[], T]) -> T:
    """A one-key call through a ``*_many`` method: its errors say nothing of rows."""
    try:
        return run()
    except StateError as exc:
        exc.unplaced("row")
        raise


def each_row(rows: Sequence[Any], check: Callable[[Any], Any]) -> list[Any]:
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
    keyspace: KeySpace

    @property
    def ttl_cleanup(self) -> IncrementalCleanup: ...


class KeyedState:
    """A registered state bound to one transaction; every call names its key and namespace."""

    def __init__(
        self,
        job: KeyedContext,
        tx: PartitionTransaction,
        descriptor: StateDescriptor,
        answer: AnswerMeter | None = None,
    ) -> None:
        self._job = job
        self._tx = tx
        # What the request's reads answer (``None``: unmetered, e.g. a test's bare transaction).
        self._answer = answer if answer is not None else AnswerMeter(job.limits.max_answer_bytes)
        self.descriptor = descriptor
        self._table = descriptor.name
        self._ttl: TtlConfig | None = descriptor.ttl
        self._clock = job.clock
        self._limits = job.limits
        self._keyspace = job.keyspace  # the layout this transaction runs under, fixed for it
        self._key_type = descriptor.key_type
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
        return checked if checked is not None else each_row(values, self._input)

    def _locate(self, key: Key, namespace: str) -> tuple[int, bytes]:
        located = self._keyspace.locate(key, self._key_type, namespace)
        if self._cleaner is not None:
            self._job.ttl_cleanup.step(self._table, self._cleaner, self._cleanup_budget, self._tx, self._clock.now_ms())
        return located

    def _row(self, key: Key, namespace: str, times: int = 1) -> Rows:
        """One key located, as the rows of a ``*_many`` call (``times`` rows of it)."""
        kg, primary = self._locate(key, namespace)
        return Rows([kg] * times, [primary] * times)

    def locate_many(self, keys: Sequence[Key], namespaces: Sequence[str]) -> Rows:
        """:meth:`_locate` for many keys given as Python values (a batch's run of operations)."""
        located = each_row(list(zip(keys, namespaces, strict=True)), self._locate_key)
        return Rows([kg for kg, _p in located], [p for _kg, p in located])  # accessed when its run applies

    def _locate_key(self, key_and_namespace: tuple[Key, str]) -> tuple[int, bytes]:
        return self._keyspace.locate(key_and_namespace[0], self._key_type, key_and_namespace[1])

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
        payload = self._read_payload(kg, primary, secondary, for_update)
        return None if payload is None else decode_value(payload)

    def _read_payload(self, kg: int, primary: bytes, secondary: bytes, for_update: bool) -> bytes | None:
        """:meth:`_read` without decoding: the value's msgpack bytes (no timestamp)."""
        raw = self._tx.get(self._table, kg, primary, secondary)
        return None if raw is None else self._from_raw(raw, kg, primary, secondary, for_update)

    def _read_many(
        self, rows: Rows, secondaries: Sequence[bytes] | None = None, *, for_update: bool = False, answers: bool = True
    ) -> list:
        """:meth:`_read` of many rows (map entries: one secondary per row)."""
        return decode_many(self._payloads_many(rows, secondaries, for_update=for_update, answers=answers))

    def _payloads_many(
        self,
        rows: Rows,
        secondaries: Sequence[bytes] | None = None,
        *,
        for_update: bool = False,
        answers: bool = True,
    ) -> list[bytes | None]:
        """:meth:`_read_many` without decoding (a columnar read may decode a whole column at once).
        A read whose values the request answers (not ``for_update``) is charged to its answer."""
        answer = self._answer if answers and not for_update else None
        if self._ttl is not None:
            # Row by row through the transaction: a read may expire (delete) or refresh the
            # record, and a later row of the same key must see that, as the next call would.
            secs = secondaries if secondaries is not None else repeat(b"")
            found = []
            for kg, primary, secondary in zip(rows.key_groups, rows.primaries, secs, strict=False):
                payload = self._read_payload(kg, primary, secondary, for_update)
                if answer is not None and payload is not None:
                    answer.charge(len(payload))
                found.append(payload)
            return found
        if answer is None:
            return self._tx.get_many(self._table, rows.key_groups, rows.primaries, secondaries)
        return answer.read_many(
            lambda budget: self._tx.get_many(self._table, rows.key_groups, rows.primaries, secondaries, budget)
        )

    def _from_raw(self, raw: bytes, kg: int, primary: bytes, secondary: bytes, for_update: bool) -> bytes | None:
        """The payload of a stored record by Flink's read rule (with TTL: expire or refresh it)."""
        ttl = self._ttl
        if ttl is None:
            return raw
        timestamp, payload = split_timestamped(raw)
        now = self._clock.now_ms()
        if is_expired(timestamp, ttl.ttl_ms, now):
            self._tx.delete_expired(self._table, kg, primary, secondary)
            return payload if ttl.return_expired and not for_update else None
        if ttl.refresh_on_read and not for_update:
            self._tx.put(self._table, kg, primary, encode_timestamped(now, payload), secondary)
        return payload

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
        numbers = pack_numbers(values)  # a column of sums or counts: packed at once
        if numbers is not None:
            return self._records_of(*numbers)
        if not all_plain(values):
            each_row(values, check_value)
        return self._records_of(each_row(values, pack_or_none))

    def _records_of(self, payloads: list[Any], longest: int | None = None, deletes: bool | None = None) -> list[bytes]:
        """The records of values already checked and packed (``pack_value``; ``None`` deletes):
        the value size limit, and TTL's timestamp. ``longest`` (the longest payload's size) and
        ``deletes`` (whether a payload is ``None``) save looking at every payload when known."""
        if longest is None:
            deletes = None in payloads if deletes is None else deletes
            present = [p for p in payloads if p is not None] if deletes else payloads
            longest = max(map(len, present)) if present else 0
        if longest > self._limits.max_value_bytes:
            each_row(payloads, self._check_payload)  # names the row
        if self._ttl is None:
            return payloads
        stamp = encode_timestamped(self._clock.now_ms(), b"")
        return [None if p is None else stamp + p for p in payloads]  # type: ignore[misc]

    def _check_payload(self, payload: bytes | None) -> None:
        if payload is not None:
            self._limits.check_value(payload)

    def _fold_many(
        self,
        rows: Rows,
        secondaries: Sequence[bytes] | None,
        values: Sequence[Any],
        function: StateFunction,
        *,
        answer: bool = False,
    ) -> list[Any] | None:
        """Fold each row's value into its accumulator with ``function``, in row order (a key
        that comes back continues from its earlier rows), then write every accumulator once.
        ``answer``: return each row's accumulator after its own fold (an ``add_get``), charged
        to the request's answer as its stored size; from the same one read."""
        if NONE_TYPE in set(map(type, values)):
            row = list(values).index(None)
            raise InvalidValue(f"cannot add null to {self.descriptor.kind} state {self._table!r}").within(
                f"row {row}", row=row
            )
        values = self._inputs(values)
        accs = self._read_many(rows, secondaries, for_update=True)
        secs = secondaries if secondaries is not None else [b""] * len(rows)
        add = function.add
        int64_sum = function.name == "sum" and self.descriptor.value_type == "int64"
        if int64_sum:  # a sum of int64 values must stay an int64
            add = lambda acc, value: COERCE["int64"](function.add(acc, value))  # noqa: E731
        # Every key once? A primary names its key group: the primaries (and secondaries) say it,
        # without a tuple per row.
        once = set(rows.primaries if secondaries is None else zip(rows.primaries, secondaries, strict=True))
        try:
            after: list[Any] | None = None  # each row's accumulator after its fold
            if len(once) == len(rows):  # every key once: one add per row, maybe vectorized
                kgs, primaries, results = rows.key_groups, rows.primaries, function.add_each(accs, values)
                if int64_sum and coerce_many("int64", results) is None:
                    raise InvalidValue("a sum left int64")  # the replay below names the row
                after = results
            else:
                slots = list(zip(rows.key_groups, rows.primaries, secs, strict=True))
                folded: dict[tuple[int, bytes, bytes], Any] = {}
                current = folded.get
                if answer:
                    after = []
                    for slot, acc, value in zip(slots, accs, values, strict=True):
                        folded[slot] = new = add(current(slot, acc), value)
                        after.append(new)
                else:
                    for slot, acc, value in zip(slots, accs, values, strict=True):
                        folded[slot] = add(current(slot, acc), value)
                kgs, primaries, secs = (list(column) for column in zip(*folded, strict=True))
                results = list(folded.values())
        except StateError:
            replayed: dict[tuple[int, bytes, bytes], Any] = {}  # fold again, row by row, to name the row
            every = zip(rows.key_groups, rows.primaries, secs, strict=True)
            for row, (slot, acc, value) in enumerate(zip(every, accs, values, strict=True)):
                try:
                    replayed[slot] = add(replayed.get(slot, acc), value)
                except StateError as exc:
                    raise exc.within(f"row {row}", row=row) from None
            raise
        records = self._records_many(results)
        self._tx.put_many(self._table, kgs, primaries, records, secs if secondaries is not None else None)
        if not answer or after is None:  # (``after`` is set whenever ``answer`` is)
            return None
        if after is not results:  # a key folded twice answers each of its rows: charge them all
            records = self._records_many(after)
        self._answer.charge(sum(map(len, records)))
        return after


def pack_or_none(value: Any) -> bytes | None:
    return None if value is None else pack_value(value)
