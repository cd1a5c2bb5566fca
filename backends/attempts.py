"""Batches, direct or staged per task attempt, and the epoch commit that makes a micro-batch
exactly-once per Spark task attempt (the driver's side is ``client/coordinator.py``).

1. The driver fences a new writer epoch on every replica.
2. Each task attempt sends its batches with ``(epoch, partition, attempt, seq)``: writes are
   staged (``backends/staging.py``), reads see the attempt's own writes. A re-sent request
   (same ``seq``) is answered again, not applied twice, so staged batches are safe to retry.
3. The driver learns from Spark which attempt of each partition succeeded, with the number
   of write operations it staged on each replica, and sends that list to every replica:
   ``prepare`` checks that the replica holds exactly those writes and seals the epoch;
   ``commit`` replays the winners' writes in (partition, attempt) order in one transaction
   (or takes their views, when that writes exactly the same), records the epoch as committed,
   and drops everything else staged under it. A commit
   re-sent after it succeeded does nothing again.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from statehouse.backends.base.transaction import StagedView
from statehouse.backends.errors import AttemptConflict, AttemptLost, EpochSealed, StateError
from statehouse.backends.job import Job, JobTransaction
from statehouse.backends.runs import FIRE, Run, RunArgs, apply_run
from statehouse.backends.staging import (
    STAGED_OP_OVERHEAD,
    STAGED_TIMER_OVERHEAD,
    AttemptRef,
    EpochStaging,
    StagedAttempt,
    Winner,
)
from statehouse.backends.timers import Advanced, TimeDomain
from statehouse.protocol.keygroups import KeyGroupRange

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Work(Protocol[R_co]):
    """What a request asks, in its door's form: a batch's or a one-key route's operations
    (``ops.BatchOps``), one columnar operation (``columns.ColumnOp``), timers' columns
    (``timer_columns.TimerColumns``), an advance. Each becomes runs (``runs.Run``) when applied;
    one entry point, :func:`perform`, applies any, and a task attempt's log keeps the runs."""

    STAGED_OVERHEAD: ClassVar[int]  # memory each staged write operation holds (``staging``)

    @property
    def held_bytes(self) -> int:
        """Memory its staged runs hold beyond the request's bytes and the overhead per write."""
        ...

    def apply(self, tx: JobTransaction) -> R_co:
        """Apply it inside ``tx`` (its runs through ``runs.apply_run``: ``tx.written`` keeps those
        that write, what a task attempt's log keeps) and answer it."""
        ...


def perform(
    job: Job, work: Work[R], *, epoch: int | None = None, attempt: AttemptRef | None = None, size: int = 0
) -> R:
    """Apply ``work`` atomically: directly, or staged for ``attempt`` under ``epoch``. ``size`` is
    the request's size in bytes: with the per-write overhead, what staging it costs."""
    return _perform(job, epoch, attempt, size, work)


class _Advance:
    """An advance as :class:`Work`: its staged run is exactly the timers it fired (``runs.FIRE``)."""

    STAGED_OVERHEAD: ClassVar[int] = STAGED_OP_OVERHEAD

    def __init__(self, domain: TimeDomain, to: int, key_groups: KeyGroupRange | None, limit: int | None) -> None:
        self.domain, self.to, self.key_groups, self.limit = domain, to, key_groups, limit
        self.done: Advanced | None = None

    @property
    def held_bytes(self) -> int:
        """The fired timers its run holds (see ``staging.STAGED_TIMER_OVERHEAD``)."""
        fired = self.done.fired.primaries if self.done is not None else []
        return sum(2 * len(primary) for primary in fired) + STAGED_TIMER_OVERHEAD * len(fired)

    def apply(self, tx: JobTransaction) -> Advanced:
        done = self.done = tx.timers.due(self.domain, self.to, self.key_groups, self.limit)
        apply_run(tx, Run(done.domain, FIRE, done.fired, RunArgs(time=done.time)))
        return done


def advance(
    job: Job,
    domain: TimeDomain,
    to: int,
    *,
    key_groups: KeyGroupRange | None = None,
    limit: int | None = None,
    epoch: int | None = None,
    attempt: AttemptRef | None = None,
) -> Advanced:
    """Advance a time domain and fire its due timers (``TimerService.due``, one firing run): directly, or
    staged for ``attempt`` under ``epoch`` as one write operation that records exactly the
    timers it fired (a re-sent request answers the same timers again)."""
    work = _Advance(domain, to, key_groups, limit)
    if attempt is not None:
        return _perform(job, epoch, attempt, 0, work)
    with job.exclusive():  # no registration between the commit and the floors' rise
        result = _perform(job, epoch, attempt, 0, work)
        job.staging.drained_timers(domain, result.drained, result.time)
    return result


def _perform(job: Job, epoch: int | None, attempt: AttemptRef | None, size: int, work: Work[R]) -> R:
    if attempt is None:
        with job.transaction(epoch=epoch) as tx:
            return work.apply(tx)
    if epoch is None:
        raise AttemptConflict("a task attempt's batch must carry the micro-batch's 'epoch'")
    with job.exclusive():
        job.check_epoch(epoch)
        staging = job.staging.open(epoch, job.committed_epoch, job.changes)
        if staging.sealed:
            raise EpochSealed(f"epoch {epoch} of job {job.name!r} was prepared for commit; it takes no more writes")
        staged = _attempt(job, staging, attempt)
        if attempt.seq == staged.seq:
            return staged.last_results  # a re-sent request: answered again, applied once
        if attempt.seq != staged.seq + 1:
            raise AttemptConflict(
                f"request {attempt.seq} of attempt {attempt.attempt!r} arrived after request {staged.seq}: "
                "an attempt must send its requests to a replica one after the other"
            )
        with job.transaction(source=staged.view) as tx:
            results = work.apply(tx)
            writes = tx.written
            count = sum(w.ops for w in writes)
            # What staging holds from now on: the writes, and the answer kept for a re-sent
            # request in place of the previous one.
            added = (size + work.STAGED_OVERHEAD * count + work.held_bytes if count else 0) + tx.answer.used
            added -= staged.answer_bytes
            if added > 0:
                job.limits.check_staging(len(staging.attempts), staging.bytes + added)
        staged.seq, staged.last_results, staged.answer_bytes = attempt.seq, results, tx.answer.used
        staged.bytes += added
        staging.bytes += added
        if count:
            staged.writes += writes
            staged.ops += count
        return results


def _replay(tx: JobTransaction, staged: StagedAttempt) -> None:
    """Apply an attempt's staged runs again, in order, inside the epoch's commit."""
    try:
        for run in staged.writes:
            apply_run(tx, run)
    except StateError as exc:
        raise exc.within(f"attempt {staged.attempt!r} (partition {staged.partition})") from None


def _attempt(job: Job, staging: EpochStaging, ref: AttemptRef) -> StagedAttempt:
    staged = staging.attempts.get(ref.attempt)
    if staged is None:
        if ref.seq != 0:
            raise AttemptLost(
                f"replica {job.replica_index} holds nothing of attempt {ref.attempt!r}, yet this is its request "
                f"{ref.seq}: the replica restarted or was restored during the attempt; the task must be retried"
            )
        job.limits.check_staging(len(staging.attempts) + 1, staging.bytes)
        return staging.begin(ref)
    if staged.partition != ref.partition:
        raise AttemptConflict(f"attempt {ref.attempt!r} writes partition {staged.partition}, not {ref.partition}")
    return staged


def _verify(job: Job, epoch: int, winners: list[Winner]) -> list[StagedAttempt]:
    """The staged attempts the winners name, each holding exactly the writes its task counted."""
    staging = job.staging.of(epoch)
    held = staging.attempts if staging is not None else {}
    found, wrong = [], []
    for winner in winners:
        staged = held.get(winner.attempt)
        count = staged.ops if staged is not None else 0
        if count != winner.ops or (staged is not None and staged.partition != winner.partition):
            wrong.append(
                {"partition": winner.partition, "attempt": winner.attempt, "expected": winner.ops, "held": count}
            )
        elif staged is not None:
            found.append(staged)
    if wrong:
        shown = ", ".join(
            f"{w['attempt']} (partition {w['partition']}): {w['held']} of {w['expected']}" for w in wrong[:5]
        )
        raise AttemptLost(
            f"replica {job.replica_index} does not hold the staged writes of {len(wrong)} winning attempt(s) of "
            f"epoch {epoch} ({shown}): it restarted or was restored during the micro-batch; abort and re-run it",
            attempts=wrong,
        )
    return sorted(found, key=lambda s: (s.partition, s.attempt))


def _check_firings(job: Job, epoch: int, found: list[StagedAttempt]) -> None:
    """Refuse to commit two winners that fired one timer: two tasks handled it."""
    clashes = _double_firings((s.attempt, s.writes) for s in found)
    if clashes:
        raise AttemptConflict(
            f"winning attempts {', '.join(map(repr, clashes))} of epoch {epoch} fired timers that another winning "
            f"attempt fired too on replica {job.replica_index}: give each partition its own key groups to advance "
            "('key_groups'); abort and re-run the micro-batch"
        )


def _double_firings(logs: Iterable[tuple[str, list[Run]]]) -> list[str]:
    """The attempts (of ``(attempt, staged runs)``) that fired a timer another one fired too:
    committing both would hand one timer to two tasks."""
    seen: dict[tuple[str, int, bytes], str] = {}
    clashes: list[str] = []
    for attempt, runs in logs:
        for run in runs:
            if run.op != FIRE:
                continue
            for kg, primary in zip(run.rows.key_groups, run.rows.primaries, strict=True):
                other = seen.setdefault((run.state, kg, primary), attempt)
                if other != attempt and attempt not in clashes:
                    clashes.append(attempt)
    return clashes


@dataclass(frozen=True, slots=True)
class EpochReport:
    """What a replica holds of an epoch, and what a prepare or commit did."""

    epoch: int
    status: str  # open | sealed | committed | none
    current_epoch: int
    committed_epoch: int
    attempts: list[dict[str, Any]]
    ops: int = 0  # write operations committed (commit) or verified (prepare)
    committed_batch: int | None = None  # the micro-batch the committed epoch applied
    topology_version: int = 0  # the layout this replica serves the job under

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "status": self.status,
            "current_epoch": self.current_epoch,
            "committed_epoch": self.committed_epoch,
            "attempts": self.attempts,
            "ops": self.ops,
            "committed_batch": self.committed_batch,
            "topology_version": self.topology_version,
        }


def describe(job: Job, epoch: int, ops_done: int = 0) -> EpochReport:
    committed = job.committed_epoch
    staging = job.staging.of(epoch)
    if epoch == committed:
        status = "committed"
    elif staging is None:
        status = "none"
    else:
        status = "sealed" if staging.sealed else "open"
    attempts = staging.summaries() if staging is not None else []
    return EpochReport(
        epoch, status, job.epoch, committed, attempts, ops_done, job.committed_batch, job.keyspace.layout_version
    )


def prepare(job: Job, epoch: int, winners: list[Winner]) -> EpochReport:
    """Check that this replica holds exactly the winners' writes, and seal the epoch."""
    with job.exclusive():
        if job.committed_epoch == epoch:
            return describe(job, epoch)
        job.check_epoch(epoch)
        found = _verify(job, epoch, winners)
        job.staging.open(epoch, job.committed_epoch, job.changes).sealed = True
        return describe(job, epoch, sum(s.ops for s in found))


def commit(job: Job, epoch: int, winners: list[Winner], batch_id: int | None = None) -> EpochReport:
    """Apply the winners' staged writes atomically and drop the rest; idempotent. ``batch_id``: the
    micro-batch they are, recorded with them (``Job.committed_batch``)."""
    with job.exclusive():
        if job.committed_epoch == epoch:
            return describe(job, epoch)  # a re-sent commit: done already
        job.check_epoch(epoch)
        found = _verify(job, epoch, winners)
        _check_firings(job, epoch, found)
        views = _views_if_exact(job, job.staging.open(epoch, job.committed_epoch, job.changes), found)
        with job.transaction() as tx:
            if views is not None:
                tx.apply_views(views)
            else:
                for staged in found:
                    _replay(tx, staged)
            tx.record_commit(epoch, batch_id)
        job.staging.drop(epoch)
        return describe(job, epoch, sum(s.ops for s in found))


def _views_if_exact(job: Job, staging: EpochStaging, found: list[StagedAttempt]) -> list[StagedView] | None:
    """The winners' views, when committing what they hold is exactly what replaying their logs
    would write: nothing changed the job since the epoch's staging began (so every view reads
    today's partition), no two winners changed one key (no two logs fold into one value), and no
    state they changed has a TTL (a replay judges expiry at commit time). Else ``None``: replay."""
    if job.changes != staging.job_changes:
        return None
    by_table: dict[str, list[Collection[bytes]]] = {}
    for staged in found:
        for table, primaries in staged.view.touched().items():
            by_table.setdefault(table, []).append(primaries)
    for table, winners in by_table.items():
        descriptor = job.descriptors.get(table)
        if descriptor is None or descriptor.ttl is not None:  # None: timers and their clocks replay too
            return None
        if not _disjoint(winners):
            return None
    return [staged.view for staged in found]


def _disjoint(winners: list[Collection[bytes]]) -> bool:
    """Whether no primary is in two of ``winners`` (one table's): the last one only iterated."""
    *first, last = winners
    seen: set[bytes] = set()
    for primaries in first:
        if not seen.isdisjoint(primaries):
            return False
        seen.update(primaries)
    return seen.isdisjoint(last)


def abort(job: Job, epoch: int) -> EpochReport:
    """Drop what ``epoch`` staged (the micro-batch failed; it re-runs under a new epoch)."""
    job.staging.drop(epoch)
    return describe(job, epoch)
