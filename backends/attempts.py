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

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from statehouse.backends import ops
from statehouse.backends.base.transaction import StagedView
from statehouse.backends.columns import ColumnOp, apply_columns
from statehouse.backends.errors import AttemptConflict, AttemptLost, EpochSealed, StateError
from statehouse.backends.job import Job, JobTransaction
from statehouse.backends.staging import AttemptRef, EpochStaging, StagedAttempt, StagedWrite, Winner
from statehouse.backends.timer_columns import TimerColumns, apply_timer_columns
from statehouse.backends.timers import Advanced, FiredTimers, TimeDomain, double_firings
from statehouse.keygroups import KeyGroupRange
from statehouse.protocol.ops import READ_OPS

# Memory a staged write takes beyond its bytes in the request: the decoded operation (~370 B,
# measured with tracemalloc) and its entry in the attempt's view. Counted against the limit so
# that STATEHOUSE_MAX_STAGED_BYTES bounds memory, not just request bytes.
STAGED_OP_OVERHEAD = 512
# A staged columnar row costs less: its view entry (~200 B measured with tracemalloc); its
# values stay in the request's Arrow table, counted as request bytes.
STAGED_ROW_OVERHEAD = 256
# A timer an attempt's advance fired stays in memory until the epoch ends three times over: in
# the attempt's log (``FiredTimers``), as a delete in its view, and decoded in the answer kept
# for a re-sent request. Charged as twice its stored primary (the bytes, and the key and
# namespace decoded from them) plus the objects around them (~400 B, measured with tracemalloc).
STAGED_TIMER_OVERHEAD = 512
R = TypeVar("R")


def run_batch(
    job: Job, operations: list[Any], *, epoch: int | None = None, attempt: AttemptRef | None = None, size: int = 0
) -> list[dict[str, Any]]:
    """Apply a batch atomically: directly, or staged for ``attempt`` under ``epoch``.

    ``size`` is the request's size in bytes: with a per-write overhead, what staging it costs."""

    def staged() -> tuple[list[StagedWrite], int]:
        writes = [op for op in operations if op["op"] not in READ_OPS]
        return writes, len(writes)

    return _run(job, epoch, attempt, size, lambda tx: ops.apply_all(tx, operations), staged, STAGED_OP_OVERHEAD)


def run_columns(
    job: Job, op: ColumnOp, *, epoch: int | None = None, attempt: AttemptRef | None = None, size: int = 0
) -> pa.Array | None:
    """:func:`run_batch` for one columnar operation: its rows count as write operations."""
    return _run(
        job,
        epoch,
        attempt,
        size,
        lambda tx: apply_columns(tx, op),
        lambda: ([op], op.rows) if op.writes else ([], 0),
        STAGED_ROW_OVERHEAD,
    )


def run_timer_columns(
    job: Job, op: TimerColumns, *, epoch: int | None = None, attempt: AttemptRef | None = None, size: int = 0
) -> None:
    """:func:`run_batch` for timers of a whole Arrow batch: its rows count as write operations."""
    _run(
        job, epoch, attempt, size, lambda tx: apply_timer_columns(tx, op), lambda: ([op], op.rows), STAGED_ROW_OVERHEAD
    )


def run_advance(
    job: Job,
    domain: TimeDomain,
    to: int,
    *,
    key_groups: KeyGroupRange | None = None,
    limit: int | None = None,
    epoch: int | None = None,
    attempt: AttemptRef | None = None,
) -> Advanced:
    """Advance a time domain and fire its due timers (``TimerService.advance``): directly, or
    staged for ``attempt`` under ``epoch`` as one write operation that records exactly the
    timers it fired (a re-sent request answers the same timers again)."""
    done: list[Advanced] = []

    def advance(tx: JobTransaction) -> Advanced:
        done.append(tx.timers.advance(domain, to, key_groups, limit))
        return done[-1]

    def run() -> Advanced:
        return _run(job, epoch, attempt, 0, advance, lambda: ([done[-1].record], 1), STAGED_OP_OVERHEAD)

    if attempt is not None:
        return run()
    with job.exclusive():  # no registration between the commit and the floors' rise
        result = run()
        job.drained_timers(domain, result.drained, result.time)
    return result


def _run(
    job: Job,
    epoch: int | None,
    attempt: AttemptRef | None,
    size: int,
    apply: Callable[[JobTransaction], R],
    writes_of: Callable[[], tuple[list[StagedWrite], int]],
    overhead: int,
) -> R:
    if attempt is None:
        with job.transaction(epoch=epoch) as tx:
            return apply(tx)
    if epoch is None:
        raise AttemptConflict("a task attempt's batch must carry the micro-batch's 'epoch'")
    with job.exclusive():
        job.check_epoch(epoch)
        staging = job.staging(epoch)
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
            results = apply(tx)
            writes, count = writes_of()
            # What staging holds from now on: the writes, and the answer kept for a re-sent
            # request in place of the previous one.
            added = (size + overhead * count + sum(map(_fired_cost, writes)) if count else 0) + tx.answer.used
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


def _fired_cost(write: StagedWrite) -> int:
    """Memory a staged advance holds beyond its operation: its fired timers (see STAGED_TIMER_OVERHEAD)."""
    if not isinstance(write, FiredTimers):
        return 0
    return sum(2 * len(primary) for _kg, primary in write.fired) + STAGED_TIMER_OVERHEAD * len(write.fired)


def _replay(tx: JobTransaction, staged: StagedAttempt) -> None:
    """Apply an attempt's staged writes again, in order, inside the epoch's commit: its batch
    operations together (one run per state and operation), its columnar writes as they came."""
    where = f"attempt {staged.attempt!r} (partition {staged.partition})"
    batch: list[Mapping[str, Any]] = []
    for write in [*staged.writes, None]:
        if isinstance(write, Mapping):
            batch.append(write)
            continue
        try:
            if batch:
                ops.apply_all(tx, batch)
            if isinstance(write, FiredTimers):
                tx.timers.apply_fired(write)  # what the attempt fired, not a new advance
            elif isinstance(write, TimerColumns):
                apply_timer_columns(tx, write)
            elif write is not None:
                apply_columns(tx, write)  # type: ignore[arg-type]  # a ColumnOp: see StagedColumns
        except StateError as exc:
            raise exc.within(where) from None
        batch = []


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
    staging = job.staged(epoch)
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
    clashes = double_firings((s.attempt, s.writes) for s in found)
    if clashes:
        raise AttemptConflict(
            f"winning attempts {', '.join(map(repr, clashes))} of epoch {epoch} fired timers that another winning "
            f"attempt fired too on replica {job.replica_index}: give each partition its own key groups to advance "
            "('key_groups'); abort and re-run the micro-batch"
        )


@dataclass(frozen=True, slots=True)
class EpochReport:
    """What a replica holds of an epoch, and what a prepare or commit did."""

    epoch: int
    status: str  # open | sealed | committed | none
    current_epoch: int
    committed_epoch: int
    attempts: list[dict[str, Any]]
    ops: int = 0  # write operations committed (commit) or verified (prepare)

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "status": self.status,
            "current_epoch": self.current_epoch,
            "committed_epoch": self.committed_epoch,
            "attempts": self.attempts,
            "ops": self.ops,
        }


def describe(job: Job, epoch: int, ops_done: int = 0) -> EpochReport:
    committed = job.committed_epoch
    staging = job.staged(epoch)
    if epoch == committed:
        status = "committed"
    elif staging is None:
        status = "none"
    else:
        status = "sealed" if staging.sealed else "open"
    attempts = staging.summaries() if staging is not None else []
    return EpochReport(epoch, status, job.epoch, committed, attempts, ops_done)


def prepare(job: Job, epoch: int, winners: list[Winner]) -> EpochReport:
    """Check that this replica holds exactly the winners' writes, and seal the epoch."""
    with job.exclusive():
        if job.committed_epoch == epoch:
            return describe(job, epoch)
        job.check_epoch(epoch)
        found = _verify(job, epoch, winners)
        job.staging(epoch).sealed = True
        return describe(job, epoch, sum(s.ops for s in found))


def commit(job: Job, epoch: int, winners: list[Winner]) -> EpochReport:
    """Apply the winners' staged writes atomically and drop the rest; idempotent."""
    with job.exclusive():
        if job.committed_epoch == epoch:
            return describe(job, epoch)  # a re-sent commit: done already
        job.check_epoch(epoch)
        found = _verify(job, epoch, winners)
        _check_firings(job, epoch, found)
        views = _views_if_exact(job, job.staging(epoch), found)
        with job.transaction() as tx:
            if views is not None:
                tx.apply_views(views)
            else:
                for staged in found:
                    _replay(tx, staged)
            tx.record_commit(epoch)
        job.drop_staging(epoch)
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
    job.drop_staging(epoch)
    return describe(job, epoch)
