"""Writes staged per task attempt until the driver commits the micro-batch's epoch.

Spark's unit of work is the task attempt: a task may fail after its writes and be retried,
or run twice (speculation), and only the driver knows which attempt of each partition won.
So the writes an attempt makes under a writer epoch are *staged*: kept as the attempt's redo
log (its write operations, in order) beside a view its own reads go through
(read-your-writes). Other attempts do not see them. The driver commits the epoch naming the
winning attempts; their logs are replayed in one transaction, and everything else staged
under the epoch is dropped (see ``backends/attempts.py``).

A redo log, not the view's values, is what commits: two partitions adding to one key must
both count, whichever order they ran in. (When no two winners wrote one key and nothing else
changed the job since staging began, the views hold exactly what the replay would write, and
the commit takes them instead: ``attempts._views_if_exact``.) Staging lives in memory: a replica that restarts
loses it, and the commit, which names each winner's operation count, then fails loudly
instead of committing part of a batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from statehouse.backends.base.partition import StorePartition
from statehouse.backends.base.transaction import StagedView
from statehouse.backends.bounds import MAX_PARTITION, MAX_SEQ, check_range
from statehouse.backends.errors import AttemptConflict, EpochSealed
from statehouse.backends.memory import released
from statehouse.backends.runs import Run
from statehouse.backends.timers import TimerFloors
from statehouse.protocol.attempts import check_attempt_id, check_unit, named_attempt
from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.keygroups import KeyGroupRange

# Memory a staged write takes beyond its bytes in the request: a decoded batch operation (~370 B,
# measured with tracemalloc) and its entry in the attempt's view. Counted against the limit so
# that STATEHOUSE_MAX_STAGED_BYTES bounds memory, not just request bytes.
STAGED_OP_OVERHEAD = 512
# A staged columnar row costs less: its view entry (~200 B measured with tracemalloc) and its
# run's row (its stored key and packed value, about the request's bytes for that row): ~325 B a
# row of 16-byte keys and 100-byte values measured in all (bench/RESULTS.md §14b).
STAGED_ROW_OVERHEAD = 256
# A timer an attempt's advance fired stays in memory until the epoch ends three times over: in
# the attempt's log (its firing's run), as a delete in its view, and decoded in the answer kept
# for a re-sent request. Charged as twice its stored primary (the bytes, and the key and
# namespace decoded from them) plus the objects around them (~400 B, measured with tracemalloc).
STAGED_TIMER_OVERHEAD = 512


_WINNER_FIELDS = frozenset({"partition", "attempt", "ops"})


@dataclass(frozen=True, slots=True)
class AttemptRef:
    """Who sends a batch: task attempt ``attempt`` of Spark partition ``partition``, its
    ``seq``-th request to this replica (0, 1, 2, ... — a re-sent request repeats its seq)."""

    partition: int
    attempt: str
    seq: int

    def __post_init__(self) -> None:
        check_range(self.partition, "partition", MAX_PARTITION)
        check_attempt_id(self.attempt)
        check_range(self.seq, "seq", MAX_SEQ)

    @classmethod
    def named_in(cls, fields: Mapping[str, Any]) -> AttemptRef | None:
        """The task attempt a request's fields name (its body, or its query decoded), each of the
        three checked, a missing one refused; ``None`` when they name none of them."""
        named = named_attempt(fields)
        return None if named is None else cls(*named)


@dataclass(frozen=True, slots=True)
class Winner:
    """An attempt the driver commits, with the write operations its task staged here.

    ``unit`` names the state update the task ran for (one ``with_state`` call of the client): a
    Spark task that runs two of them has one attempt per unit, both of its partition. The
    replica cannot tell those from two attempts of one partition, so the driver says which
    unit each winner is of, and a (unit, partition) named twice is refused.
    """

    partition: int
    attempt: str
    ops: int
    unit: str = ""

    def __post_init__(self) -> None:
        check_range(self.partition, "partition", MAX_PARTITION)
        check_attempt_id(self.attempt)
        check_range(self.ops, "ops", MAX_SEQ)
        check_unit(self.unit)

    @classmethod
    def parse(cls, items: Any) -> list[Winner]:
        """The ``attempts`` of a prepare or commit body; each attempt, and each (unit, partition),
        at most once: two winners of one partition's unit would apply its task's writes twice."""
        if not isinstance(items, list):
            raise InvalidArgument('\'attempts\' must be a list of {"partition", "attempt", "ops"[, "unit"]}')
        winners = []
        for item in items:
            if not isinstance(item, Mapping) or not _WINNER_FIELDS <= set(item) <= _WINNER_FIELDS | {"unit"}:
                raise InvalidArgument(f'each attempt must be {{"partition", "attempt", "ops"[, "unit"]}}; got {item!r}')
            winners.append(cls(item["partition"], item["attempt"], item["ops"], item.get("unit", "")))
        if len({w.attempt for w in winners}) != len(winners):
            raise InvalidArgument("an attempt is named twice in 'attempts'")
        seen: dict[tuple[str, int], str] = {}
        for w in winners:
            first = seen.setdefault((w.unit, w.partition), w.attempt)
            if first != w.attempt:
                of_unit = f" of unit {w.unit!r}" if w.unit else ""
                raise AttemptConflict(
                    f"partition {w.partition}{of_unit} is named twice in 'attempts' ({first!r} and {w.attempt!r}): "
                    "name the one attempt of each partition that won, or its writes count twice (attempts of "
                    "different state updates in one task say so with 'unit')"
                )
        return winners


class StagedAttempt:
    """One attempt's staged writes on this replica: its redo log (the runs it wrote, in order:
    ``backends/runs.py``) and its own view."""

    __slots__ = ("answer_bytes", "attempt", "bytes", "last_results", "ops", "partition", "seq", "view", "writes")

    def __init__(self, partition: int, attempt: str, view: StagedView) -> None:
        self.partition = partition
        self.attempt = attempt
        self.view = view
        self.writes: list[Run] = []
        self.ops = 0  # write operations in ``writes`` (``Run.ops``)
        self.seq = -1  # the last request applied
        self.last_results: Any = []  # its answer, for a re-sent request
        self.answer_bytes = 0  # what that answer read (``AnswerMeter``), counted in ``bytes``
        self.bytes = 0  # memory held: writes, fired timers, the kept answer (STATEHOUSE_MAX_STAGED_BYTES)

    def summary(self) -> dict[str, Any]:
        return {"partition": self.partition, "attempt": self.attempt, "ops": self.ops, "bytes": self.bytes}


class EpochStaging:
    """Everything staged under one writer epoch. ``sealed`` after a successful prepare: the
    epoch's staging is then what the driver verified, and takes no more writes."""

    def __init__(self, epoch: int, partition: StorePartition, job_changes: int = 0) -> None:
        self.epoch = epoch
        self._partition = partition
        self.job_changes = job_changes  # ``Job.changes`` when staging began
        self.attempts: dict[str, StagedAttempt] = {}
        self.sealed = False
        self.bytes = 0

    def begin(self, ref: AttemptRef) -> StagedAttempt:
        staged = self.attempts[ref.attempt] = StagedAttempt(ref.partition, ref.attempt, StagedView(self._partition))
        return staged

    def summaries(self) -> list[dict[str, Any]]:
        return [a.summary() for a in sorted(self.attempts.values(), key=lambda a: (a.partition, a.attempt))]


class Staging:
    """What task attempts stage on one job's replica: the current writer epoch's staging (one at
    a time: fencing a newer epoch drops the older one's, which can never commit), and the timer
    floors, which a committed firing may raise only while nothing is staged. The job holds one;
    its requests call in under the job's lock (``Job.exclusive``), and what runs outside a
    request (dropping an epoch, a committed firing's floors) takes that lock itself."""

    def __init__(self, job: str, partition: StorePartition, lock: threading.RLock) -> None:
        self._job = job
        self._partition = partition
        self._lock = lock
        self._epoch: EpochStaging | None = None
        self.timer_floors = TimerFloors()  # where firing seeks to per key group
        # The micro-batch a coordinator began (its epoch) and when it last showed life (monotonic
        # seconds); it ends with the epoch's commit or abort, or a newer fence. In memory only:
        # a restarted replica holds nothing staged, and a begun batch fails at its prepare.
        self._in_flight: tuple[int, float] | None = None

    def of(self, epoch: int) -> EpochStaging | None:
        """What is staged under ``epoch``, if anything."""
        staging = self._epoch
        return staging if staging is not None and staging.epoch == epoch else None

    def open_batch(self, epoch: int) -> None:
        """A coordinator began a micro-batch under ``epoch`` (its fence)."""
        self._in_flight = (epoch, time.monotonic())

    def in_flight(self, lease_s: float) -> int | None:
        """The epoch of the micro-batch in flight: begun and neither committed nor aborted, with a
        sign of life (its fence, a staged write, its prepare) within ``lease_s`` seconds; a
        coordinator that died mid-batch holds nothing past its lease."""
        in_flight = self._in_flight
        if in_flight is None or time.monotonic() - in_flight[1] > lease_s:
            return None
        return in_flight[0]

    def open(self, epoch: int, committed_epoch: int, job_changes: int) -> EpochStaging:
        """The staging of ``epoch``, the job's current epoch (under the job's lock), begun if
        need be; refused once ``epoch`` was committed: what it staged then could never commit."""
        if self._in_flight is not None and self._in_flight[0] == epoch:
            self._in_flight = (epoch, time.monotonic())
        staging = self.of(epoch)
        if staging is None:
            if committed_epoch == epoch:
                raise EpochSealed(
                    f"epoch {epoch} of job {self._job!r} was committed; it takes no more writes: a late task attempt "
                    "of a finished micro-batch (its writes are not applied), or the driver must fence a new epoch"
                )
            staging = self._epoch = EpochStaging(epoch, self._partition, job_changes)
        return staging

    def drop(self, epoch: int | None = None) -> None:
        """Forget what ``epoch`` staged (after its commit, or an abort), or whatever is staged
        (``None``: a newer epoch was fenced, or the job retired)."""
        with self._lock:
            if self._in_flight is not None and (epoch is None or self._in_flight[0] == epoch):
                self._in_flight = None
            staging = self._epoch
            if staging is not None and (epoch is None or staging.epoch == epoch):
                size, self._epoch, staging = staging.bytes, None, None  # no reference left: freed now
                released(size)

    def epochs_touching(self, ranges: Sequence[KeyGroupRange]) -> list[int]:
        """The open epoch, if its attempts' staged writes touch these key groups (call under
        the job's lock): a live rescale must not freeze them under an uncommitted micro-batch."""
        staging = self._epoch
        if staging is None or not ranges:
            return []
        touched = set().union(*(a.view.key_groups() for a in staging.attempts.values()))
        return [staging.epoch] if any(kg in r for kg in touched for r in ranges) else []

    def forget_timer_floors(self) -> None:
        """Seek from every key group's start again (key groups were dropped: floors are
        recomputed as firings drain them, not trusted)."""
        self.timer_floors = TimerFloors()

    def drained_timers(self, domain: str, key_groups: Iterable[int], time: int) -> None:
        """A committed firing left nothing at or below ``time`` in these key groups: later
        firings seek past it, unless an attempt's staged view may hold timers the floors must
        keep below them (they were lowered for those, and raising would hide them)."""
        with self._lock:
            if self._epoch is None or not self._epoch.attempts:
                self.timer_floors.raise_to(domain, key_groups, time)
