"""Timers: Flink's ``InternalTimerService`` per job, event time and processing time.

A timer is ``(key, namespace, timestamp)`` in one time domain; registering it twice is one
timer (Flink dedupes per key, namespace and timestamp). Timers live in the job's partition as
two flat keyed tables (``reserved.EVENT_TIMERS_TABLE``, ``PROCESSING_TIMERS_TABLE``), stored
under their key's key group, so full, incremental and savepoint snapshots carry them per key
group and a restore or rescale moves them with their key groups, exactly like keyed state.

Stored layout (one row per timer, empty value)::

    primary = timestamp (8 bytes big-endian, sign bit flipped: byte order is numeric order)
            + key type (1 byte: 0 string, 1 int, 2 long)
            + key field + namespace field (as ``codec.encode_primary``)

so a scan of one key group from its start meets its timers in firing order; a replica's firing
order is (timestamp, key group, key, namespace): a merge of its key groups' scans.

Key type: a Flink operator has one key type; a Statehouse job has one per state. So each timer
carries its key type (default ``string``): a timer for key ``7`` of a ``long``-keyed state is
registered with ``key_type: long``, lands in that key's key group (with its state, on the
replica that owns it) and fires with the same typed key. The type is part of the timer's
identity: ``"7"`` and ``7`` are two timers.

Time: per job and replica, each domain has a current time (the watermark for event time, the
clock for processing time), kept in its own small table (``reserved.TIMER_CLOCK_TABLE``).
An advance (``attempts.advance``) raises it (never lowers it: an older value leaves it where it is,
as a fence does) and fires — returns in order and deletes in the same transaction — every timer
at or below it. A timer registered at or below the current time therefore fires on the next
advance, as in Flink. As in Flink, the time is not state: snapshots hold the timers but not the
time, and a restored (or rescaled) replica starts without one until its first advance. (Taking
one part's time would fire another part's timers early after a rescale.) Firing is a write
like any other: fenced by the writer epoch, and staged under a Spark task attempt (its log
records exactly the timers it fired, so the epoch commit removes those and no others).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

from statehouse.backends.base.partition import StorePartition
from statehouse.backends.base.transaction import PartitionTransaction
from statehouse.backends.keyspace import (
    TIMESTAMP_BYTES,
    KeySpace,
    Rows,
    decode_timestamp,
    encode_timestamp,
    first_page,
    position_of,
    timer_key_type,
)
from statehouse.backends.reserved import EVENT_TIMERS_TABLE, PROCESSING_TIMERS_TABLE, TIMER_CLOCK_TABLE
from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.keygroups import INT64_MAX, INT64_MIN, KEY_TYPES, KeyGroupRange, KeyType
from statehouse.snapshots.stored.codec import decode_primary

TimeDomain = Literal["event", "processing"]
TIME_DOMAINS: tuple[TimeDomain, ...] = get_args(TimeDomain)
TABLES: dict[TimeDomain, str] = {"event": EVENT_TIMERS_TABLE, "processing": PROCESSING_TIMERS_TABLE}


def check_timestamp(value: Any, what: str = "timestamp") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not INT64_MIN <= value <= INT64_MAX:
        raise InvalidArgument(f"'{what}' must be a 64-bit integer (milliseconds); got {value!r}")
    return value


def check_domain(value: Any) -> TimeDomain:
    if value not in TIME_DOMAINS:
        raise InvalidArgument(f"'domain' must be one of {', '.join(TIME_DOMAINS)}; got {value!r}")
    return value


def check_key_type(value: Any) -> KeyType:
    if value not in KEY_TYPES:
        raise InvalidArgument(f"'key_type' must be one of {', '.join(KEY_TYPES)}; got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Timer:
    timestamp: int
    key: str | int
    key_type: KeyType
    namespace: str
    key_group: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp,
            "key": self.key,
            "key_type": self.key_type,
            "ns": self.namespace,
            "key_group": self.key_group,
        }


def decode_timer(key_group: int, primary: bytes) -> Timer:
    key_type = timer_key_type(primary)
    key, namespace = decode_primary(primary[TIMESTAMP_BYTES + 1 :], key_type)
    return Timer(decode_timestamp(primary), key, key_type, namespace, key_group)


@dataclass(frozen=True, slots=True)
class Advanced:
    """The result of an advance: the domain's time after it, the timers fired (in firing order),
    and whether more are due (a ``limit`` cut the firing short: they fire on the next advance)."""

    domain: TimeDomain
    time: int
    timers: list[Timer]
    more: bool
    fired: Rows  # the timers fired, located (what a task attempt's log records of the advance)
    drained: tuple[int, ...] = ()  # key groups left with nothing due (``TimerFloors.raise_to``)

    def to_dict(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "time": self.time,
            "timers": [t.to_dict() for t in self.timers],
            "more": self.more,
        }


class TimerFloors:
    """Per (time domain, key group), a time below which no timer is stored, in the partition or
    in any attempt's staged view: where firing seeks to instead of the key group's start. On
    RocksDB every fired timer leaves a tombstone at the head of its key group, and a seek from
    the start would step over all the timers ever fired there (Flink's RocksDB timer queues
    cache their heads for the same reason). In memory only: unknown (a new job object, after a
    restart or a restore) means the start. Every registration lowers it, staged or not (too low
    only costs a longer seek); only a committed firing that left nothing due in a key group,
    with nothing staged, raises it."""

    def __init__(self) -> None:
        self._floors: dict[tuple[str, int], int] = {}

    def seek_after(self, domain: str, key_group: int) -> bytes | None:
        """The position a key group's scan starts after (``None``: its start)."""
        floor = self._floors.get((domain, key_group))
        if floor is None or floor == INT64_MIN:
            return None
        return encode_timestamp(floor - 1) + b"\xff"  # after every timer of floor - 1 (type tags are < 0xff)

    def lower(self, domain: str, key_group: int, timestamp: int) -> None:
        floor = self._floors.get((domain, key_group))
        if floor is not None and timestamp < floor:
            self._floors[(domain, key_group)] = timestamp

    def raise_to(self, domain: str, key_groups: Iterable[int], time: int) -> None:
        """Nothing at or below ``time`` is left in these key groups (a committed firing)."""
        if time < INT64_MAX:
            for kg in key_groups:
                self._floors[(domain, kg)] = max(self._floors.get((domain, kg), INT64_MIN), time + 1)


class FloorsHolder(Protocol):
    """Who keeps a job's timer floors (``staging.Staging``)."""

    timer_floors: TimerFloors


class TimerContext(Protocol):
    """What timers need of their job (a ``Job``)."""

    keyspace: KeySpace

    @property
    def staging(self) -> FloorsHolder: ...

    def exclusive(self) -> AbstractContextManager[None]: ...

    @property
    def key_group_range(self) -> KeyGroupRange: ...

    @property
    def partition(self) -> StorePartition: ...


class TimerService:
    """The timers of one job, bound to one transaction (``JobTransaction.timers``)."""

    def __init__(self, job: TimerContext, tx: PartitionTransaction) -> None:
        self._job = job
        self._tx = tx

    def _table(self, domain: TimeDomain, create: bool) -> str | None:
        """The domain's table; made on first registration (a job without timers has none)."""
        table = TABLES[check_domain(domain)]
        partition = self._job.partition
        if table not in partition.tables():
            if not create:
                return None
            partition.create_table(table, nested=False)  # an empty table: harmless if this rolls back
        return table

    def _locate(self, key: str | int, key_type: KeyType, namespace: str, timestamp: int) -> tuple[int, bytes]:
        return self._job.keyspace.locate_timer(key, check_key_type(key_type), namespace, check_timestamp(timestamp))

    def register(
        self, domain: TimeDomain, key: str | int, timestamp: int, namespace: str = "", key_type: KeyType = "string"
    ) -> None:
        """Flink's ``registerEventTimeTimer`` / ``registerProcessingTimeTimer`` (idempotent)."""
        key_group, primary = self._locate(key, key_type, namespace, timestamp)
        self.write_many(check_domain(domain), [key_group], [primary])

    def delete(
        self, domain: TimeDomain, key: str | int, timestamp: int, namespace: str = "", key_type: KeyType = "string"
    ) -> None:
        """Flink's ``deleteEventTimeTimer`` / ``deleteProcessingTimeTimer``: absent is a no-op."""
        key_group, primary = self._locate(key, key_type, namespace, timestamp)
        self.write_many(check_domain(domain), [key_group], [primary], delete=True)

    def write_many(
        self, domain: TimeDomain, key_groups: list[int], primaries: list[bytes], *, delete: bool = False
    ) -> None:
        """Register (or delete) timers already located and encoded (a timer run: ``backends/runs.py``)."""
        table = self._table(domain, create=not delete)
        if table is not None:
            self._tx.put_many(table, key_groups, primaries, [None if delete else b""] * len(primaries))
        if not delete:
            for kg, primary in zip(key_groups, primaries, strict=True):
                self._job.staging.timer_floors.lower(domain, kg, decode_timestamp(primary))

    def current_time(self, domain: TimeDomain) -> int | None:
        """The domain's time on this replica: ``None`` until the first advance (since a restore)."""
        domain = check_domain(domain)
        if TIMER_CLOCK_TABLE not in self._job.partition.tables():
            return None
        raw = self._tx.get(TIMER_CLOCK_TABLE, 0, domain.encode())
        return None if raw is None else int(raw)

    def _raise_time(self, domain: TimeDomain, to: int) -> int:
        current = self.current_time(domain)
        if current is not None and current >= to:
            return current
        if current is None:
            self._job.partition.create_table(TIMER_CLOCK_TABLE, nested=False)  # a no-op when it exists
        self._tx.put(TIMER_CLOCK_TABLE, 0, domain.encode(), str(to).encode())
        return to

    def due(
        self, domain: TimeDomain, to: int, key_groups: KeyGroupRange | None = None, limit: int | None = None
    ) -> Advanced:
        """What advancing the domain's time to ``to`` (never lowering it) fires: every timer at
        or below the time, in (timestamp, key group, key, namespace) order. Read only: the
        firing is a run (``runs.FIRE``, ``attempts.advance``) that raises the time and deletes
        exactly these. ``key_groups`` restricts the firing to those of this replica's key groups
        (a Spark partition fires its own); ``limit`` caps the timers fired (the rest stay due)."""
        domain, to = check_domain(domain), check_timestamp(to, "to")
        current = self.current_time(domain)
        time = to if current is None or current < to else current
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise InvalidArgument(f"'limit' must be a positive integer; got {limit!r}")
        table = self._table(domain, create=False)
        owned = self._job.key_group_range
        groups = owned if key_groups is None else owned.intersection(key_groups)
        due: list[tuple[int, bytes]] = []
        left: set[int] = set()
        if table is not None:
            due, left = self._due(table, domain, groups, encode_timestamp(time), limit)
        drained = tuple(kg for kg in groups if kg not in left)
        fired = Rows([kg for kg, _p in due], [p for _kg, p in due])
        return Advanced(domain, time, [decode_timer(kg, p) for kg, p in due], bool(left), fired, drained)

    def _due(
        self, table: str, domain: TimeDomain, groups: Iterable[int], bound: bytes, limit: int | None
    ) -> tuple[list[tuple[int, bytes]], set[int]]:
        """The first ``limit`` timers at or below ``bound`` over ``groups``, in firing order, and
        the key groups where more are due. One key group is read at a time (a replica may own
        thousands: one open iterator each would cost more than the merge), from its floor, and
        only as far as its timers can still be among the first ``limit``."""
        chosen: list[tuple[bytes, int, bytes]] = []  # (timestamp bytes, key group, primary), sorted
        left: set[int] = set()
        floors = self._job.staging.timer_floors
        for kg in groups:
            for primary in self._tx.primaries_from(table, kg, floors.seek_after(domain, kg)):
                row = (primary[:TIMESTAMP_BYTES], kg, primary)
                if row[0] > bound:
                    break
                if limit is None:
                    chosen.append(row)
                    continue
                if len(chosen) >= limit:
                    if row >= chosen[-1]:
                        left.add(kg)
                        break  # the rest of this key group comes later still
                    left.add(chosen.pop()[1])
                insort(chosen, row)
        if limit is None:
            chosen.sort()
        return [(kg, primary) for _ts, kg, primary in chosen], left

    def apply_fired(self, domain: TimeDomain, time: int, fired: Rows) -> None:
        """A staged advance again, in the epoch commit: raise the time, delete what it fired."""
        self._raise_time(domain, time)
        table = TABLES[domain]
        for kg, primary in zip(fired.key_groups, fired.primaries, strict=True):
            self._tx.delete(table, kg, primary)

    def locate_op(self, op: Mapping[str, Any]) -> tuple[TimeDomain, int, bytes]:
        """A batch's timer operation (``register_timer`` / ``delete_timer``) checked: its time
        domain, and the timer's key group and stored key."""
        name = op.get("op")
        if "key" not in op:
            raise InvalidArgument(f"missing 'key': {name} needs the key the timer belongs to")
        if "timestamp" not in op:
            raise InvalidArgument(f"missing 'timestamp': {name} needs the timer's time, in milliseconds")
        domain = check_domain(op.get("domain", "event"))
        key_type = check_key_type(op.get("key_type", "string"))
        return (domain, *self._locate(op["key"], key_type, op.get("ns", ""), op["timestamp"]))


# -- reading the stored timers (listings, counts): call under ``Job.exclusive`` ----------------


def list_timers(
    job: TimerContext,
    domain: TimeDomain,
    key_group: int | None = None,
    start_after: tuple[int, bytes] | None = None,
) -> Iterator[tuple[Timer, tuple[int, bytes]]]:
    """The stored timers of a domain in key-group then firing order, each with its position
    (for paging: pass the last one back as ``start_after``)."""
    table = TABLES[check_domain(domain)]
    partition = job.partition
    if table not in partition.tables():
        return
    groups: Iterable[int] = [key_group] if key_group is not None else job.key_group_range
    floors = job.staging.timer_floors
    for kg in groups:
        if start_after is not None and kg < start_after[0]:
            continue
        previous = start_after[1] if start_after is not None and kg == start_after[0] else None
        floor = floors.seek_after(domain, kg)  # past the fired timers' tombstones
        after = floor if previous is None or (floor is not None and floor > previous) else previous
        for primary in partition.primaries_from(table, kg, after):
            yield decode_timer(kg, primary), (kg, primary)


def timers_page(
    job: TimerContext, domain: TimeDomain, key_group: int | None, after: bytes | None, limit: int
) -> tuple[list[Timer], bytes | None]:
    """One page of :func:`list_timers`: up to ``limit`` after the position ``after`` (a previous
    page's), and where the next page starts (``None``: the last page)."""
    if key_group is not None:
        job.keyspace.check_key_group(key_group)
    with job.exclusive():  # the iteration seeks in the live partition: no write in between
        found, next_after = first_page(list_timers(job, domain, key_group, position_of(after)), limit, _position)
    return [timer for timer, _position in found], next_after


def _position(listed: tuple[Timer, tuple[int, bytes]]) -> tuple[int, bytes]:
    return listed[1]


def count_timers(job: TimerContext, domain: TimeDomain, key_group: int | None = None) -> dict[int, int]:
    """Stored timers per key group of this replica (key groups without timers left out)."""
    if key_group is not None:
        job.keyspace.check_key_group(key_group)
    counts: dict[int, int] = {}
    table = TABLES[check_domain(domain)]
    partition = job.partition
    if table not in partition.tables():
        return counts
    groups: Iterable[int] = [key_group] if key_group is not None else job.key_group_range
    for kg in groups:
        n = sum(1 for _ in partition.primaries_from(table, kg, job.staging.timer_floors.seek_after(domain, kg)))
        if n:
            counts[kg] = n
    return counts
