"""The driver's checkpoint coordinator (the role of Flink's JobManager) and the exactly-once
protocol for Spark micro-batches.

A *global* checkpoint N is complete when every replica has completed its part of N
(client/global_checkpoints.py). Which micro-batch the state holds is the replicas' (recorded by
the epoch commit), and a live rescale (client/rescale.py), whoever starts it, runs between two
micro-batches.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from statehouse.client.attempts import CommitMessage, commit_bodies, winners
from statehouse.client.errors import StatehouseError, Unavailable
from statehouse.client.global_checkpoints import CheckpointCoordinator, CheckpointFailed, GlobalCheckpoint
from statehouse.client.rescale import LiveRescale, Progress, RescaleReport
from statehouse.protocol import routes

if TYPE_CHECKING:
    from statehouse.client.client import StatehouseClient
    from statehouse.client.job import JobClient

log = logging.getLogger(__name__)
# How often a micro-batch waiting at its boundary looks whether the live rescale ended: a cut is
# frozen a second or less, about a micro-batch, so each poll's delay adds to that batch. A move
# still pending after MOVE_POLL_STEADY looks (2 s of pauses; its coordinator gone, say) is looked
# at less and less often, up to once a second.
MOVE_POLL, MOVE_POLL_MAX, MOVE_POLL_STEADY = 0.05, 1.0, 40
# How long a micro-batch waits at its boundary for a live rescale (or a replica of it restarting).
MOVE_WAIT = 600.0
# A batch's checkpoint that a move's copy subsumed is taken again at once this many times, then
# after the move (a copy takes two checkpoints, the first one and the one after its catch-up).
_RETAKES_BESIDE_COPY = 3

__all__ = [
    "Applied",
    "BatchPlan",
    "CheckpointCoordinator",
    "CheckpointFailed",
    "GlobalCheckpoint",
    "MicroBatchCoordinator",
    "MicroBatchLost",
    "MoveWaitTimeout",
    "StateBehind",
    "job_at_boundary",
]


def move_poll_pauses() -> Iterator[float]:
    """The pauses between a waiting micro-batch's looks at a pending live rescale: ``MOVE_POLL``
    for the first ``MOVE_POLL_STEADY``, then half as long again each time, up to ``MOVE_POLL_MAX``."""
    yield from itertools.repeat(MOVE_POLL, MOVE_POLL_STEADY)
    pause = MOVE_POLL
    while True:
        pause = min(MOVE_POLL_MAX, pause * 1.5)
        yield pause


@dataclass(frozen=True)
class BatchPlan:
    """What an attempt of micro-batch ``batch_id`` may do: write with ``epoch``, or, when the batch
    was already applied and checkpointed (``replay``), only read."""

    batch_id: int
    epoch: int | None
    replay: bool
    version: int | None = None  # the topology version it began under


@dataclass(frozen=True)
class Applied:
    """What a job's state holds, as its replicas report it: micro-batch ``batch_id`` (-1: none),
    committed under writer epoch ``epoch``."""

    batch_id: int
    epoch: int


class StateBehind(StatehouseError):
    """The state's last applied micro-batch is older than the one before ``batch_id``."""


class MicroBatchLost(StatehouseError):
    """A replica does not hold the micro-batch's staged writes (it restarted or was restored
    during the batch, or another writer fenced the job): nothing was committed; re-run it."""


class MoveWaitTimeout(StatehouseError):
    """A live rescale stayed pending past the coordinator's ``move_wait``: the micro-batch did not begin."""


def _await_replica(exc: Unavailable, what: str, deadline: float) -> None:
    """A replica did not answer at a micro-batch's boundary (restarting: a live rescale's joining
    one, say): ``exc`` past ``deadline``; until then a pause, logged, after which the caller routes
    by the layout as it is then and asks again."""
    if time.monotonic() > deadline:
        raise exc
    log.warning("%s waits for a replica: %s", what, exc.detail)
    time.sleep(0.5)


def job_at_boundary(client: StatehouseClient, name: str, what: str, wait: float = MOVE_WAIT) -> JobClient:
    """``client.job(name)`` where a micro-batch begins or commits: every replica is asked about the
    job, and one that does not answer is waited for (:func:`_await_replica`) for at most ``wait``
    seconds, as :meth:`MicroBatchCoordinator.begin` waits for one; ``what``: the batch, for the log."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return client.job(name)
        except Unavailable as exc:
            _await_replica(exc, what, deadline)
            client.replicas.relearn()


class MicroBatchCoordinator(CheckpointCoordinator):
    """Exactly-once state updates for Spark micro-batches, per task attempt.

    Which micro-batch a job's state holds is replica state: every replica records the batch id
    with the epoch commit that applies it (``committed_batch``), every checkpoint and savepoint
    records it, a restore restores it and a live rescale carries it to the new owners, whoever
    triggers them. When an attempt of batch ``b`` begins (:meth:`begin`), a new epoch is fenced
    on every replica (what older attempts staged is dropped, their late writes refused), and the
    fence answers what the state holds:

    * a batch at or past ``b``: the attempt is a *replay*: it must not write (its outputs can
      be recomputed from state);
    * replicas that committed different epochs (a driver died in the middle of a commit): every
      replica is restored to the newest checkpoint that holds the older one, then fenced again;
    * a live rescale pending (started by anyone: an operator, a chart hook, this driver): the
      batch waits at its boundary until the move has ended (at most ``move_wait`` seconds,
      logged), then runs on the layout the move left. A fenced micro-batch holds a move's
      prepare off until it is committed or aborted (the replicas' ``STATEHOUSE_BATCH_LEASE_S``
      bounds how long a dead driver's batch does).

    Tasks then stage their writes under the epoch (``client/spark.py``). :meth:`commit` takes
    the commit messages of the successful tasks, picks one attempt per partition, *prepares*
    every replica (each checks it holds exactly those writes, and seals the epoch), commits
    every replica with the batch id, and takes the checkpoint for ``b`` (after a move that met
    it, on the new layout). A failed prepare aborts everywhere and nothing is applied
    (:class:`MicroBatchLost`: re-run the batch).

    Between two micro-batches, :meth:`rescale` changes the replica count live (client/rescale.py);
    a driver restarting after a crash calls :meth:`recover` first: it finishes a move its
    predecessor left (aborting one that was not decided), never one another initiator started.
    """

    _open: BatchPlan | None = None  # the micro-batch begun and not yet committed

    def __init__(
        self,
        job: JobClient,
        *,
        initiator: str | None = None,
        move_wait: float = MOVE_WAIT,
        timeout: float = 300.0,
        poll_interval: float = 0.05,
    ) -> None:
        super().__init__(job, timeout=timeout, poll_interval=poll_interval)
        self.initiator = initiator or f"query:{job.name}"
        self.move_wait = move_wait
        self._checkpointed_epoch: int | None = None  # the committed epoch this coordinator's last checkpoint holds

    # -- what the state holds ------------------------------------------------------------

    def applied(self) -> Applied:
        """The micro-batch every replica's state holds (``batch_id`` -1: none), undoing a commit a
        dead driver left half done first (:meth:`recover` without the move)."""
        return self._applied(self._undo_half_commit(self.job.infos()))

    def _applied(self, answers: list[dict[str, Any]]) -> Applied:
        """What replicas that agree on their committed epoch hold: their ``committed_batch``, or
        for state committed before replicas recorded it, the batch its checkpoints' metadata names."""
        epoch = answers[0]["committed_epoch"]
        batches = [answer["committed_batch"] for answer in answers if answer.get("committed_batch") is not None]
        if batches:
            return Applied(max(batches), epoch)
        for candidate in reversed(self.completed(every_layout=True)):
            if candidate.metadata.get("epoch") == epoch and "batch_id" in candidate.metadata:
                return Applied(int(candidate.metadata["batch_id"]), epoch)
        return Applied(-1, epoch)

    def _undo_half_commit(self, answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``answers`` (one per replica, each with its ``committed_epoch``) when they agree; else a
        driver died in the middle of a commit: every replica is restored to the newest checkpoint
        (of any layout) whose every part holds the oldest of those epochs, and read again."""
        epochs = {answer["committed_epoch"] for answer in answers}
        if len(epochs) == 1:
            return answers
        oldest = min(epochs)
        point = self._restore_point(oldest)
        if point is None:
            raise StatehouseError(
                f"job {self.job.name!r}: replicas committed different micro-batch epochs ({sorted(epochs)}) and no "
                f"completed checkpoint holds epoch {oldest} on every part: restore a savepoint (statehouse restore)"
            )
        log.warning(
            "job %r: a commit was left half done (replicas at epochs %s); restoring checkpoint %d",
            self.job.name,
            sorted(epochs),
            point.checkpoint_id,
        )
        self.restore(point.checkpoint_id)
        self._checkpointed_epoch = oldest
        return self.job.infos()

    def _restore_point(self, epoch: int, *, moved: bool = False) -> GlobalCheckpoint | None:
        """The newest checkpoint every part of which holds ``epoch``: of this layout, else of an
        earlier one (a live rescale's own checkpoint holds what the move carried). Right after a
        move (``moved``) this layout has none yet, and each replica reads storage to list its
        checkpoints: one listing of every layout's then serves both."""
        count = len(self.job.replicas)
        for every_layout in (True,) if moved else (False, True):
            holding = [
                candidate
                for candidate in self.completed(every_layout=every_layout)
                if all(part.get("committed_epoch") == epoch for part in candidate.parts)
            ]
            ours = [c for c in holding if all(part.get("replica_count") == count for part in c.parts)]
            if found := ours or holding:
                return found[-1]
        return None

    def ensure_restore_point(self, applied: Applied, *, moved: bool = False) -> None:
        """A checkpoint holds what the state holds before a batch writes on it, so that a commit
        left half done can be undone: taken when neither this coordinator's last checkpoint nor a
        listed one (a move's, a restore's) does. ``moved``: a live rescale ended since the last batch."""
        if self._checkpointed_epoch == applied.epoch:
            return
        if self._restore_point(applied.epoch, moved=moved) is None:
            self.checkpoint(metadata={"batch_id": applied.batch_id, "epoch": applied.epoch})
        self._checkpointed_epoch = applied.epoch

    # -- a live rescale --------------------------------------------------------------------

    def rescale(
        self,
        to: int,
        new_urls: list[str] | None = None,
        *,
        wait: float = 300.0,
        progress: Progress | None = None,
    ) -> RescaleReport:
        """Change the replica count to ``to``, live, between two micro-batches (refused while this
        coordinator's batch is open: the cut is a batch boundary). ``new_urls``: the added
        replicas' URLs, or the whole new set's (see :class:`~statehouse.client.rescale.LiveRescale`).
        The state moves with the micro-batch it holds, so the next batch (and a replay) runs on
        the new layout."""
        if self._open is not None:
            raise StatehouseError(
                f"micro-batch {self._open.batch_id} is open: rescale between micro-batches (after commit)"
            )
        with LiveRescale(
            self.job.replicas, to, new_urls, wait=wait, progress=progress, initiator=self.initiator
        ) as move:
            return move.run()

    def recover(self) -> list[dict[str, Any]]:
        """After a driver's crash: finish the live rescale it left (forward when commit was decided;
        aborted when not), leaving a move another initiator started to its initiator (the next
        :meth:`begin` waits for it); then undo a commit it left half done: every replica restored
        to a checkpoint that holds the older epoch. Returns every replica's job info."""
        with LiveRescale(self.job.replicas, initiator=self.initiator) as move:
            pending = move.pending()  # (the client now routes to the old replicas)
            if pending == "commit":
                move.resume()
            elif pending is not None and move.pending_initiator() == self.initiator:
                move.abort()
            elif pending is not None:
                log.info("job %r: a live rescale by another initiator is pending; left to it", self.job.name)
                return self.job.infos()
        self._relearn()
        return self._undo_half_commit(self.job.infos())

    def _relearn(self) -> None:
        """Route by the layout the replicas serve now (after a move this client did not drive; a
        replica of it still restarting is waited for by the calls that reach it)."""
        self.job.replicas.relearn()
        self._next_listed = None  # the new layout's replicas list their own ids

    def _await_move(self, batch_id: int, deadline: float) -> None:
        """Until no live rescale is pending on the replicas (its initiator ends it), then route by
        the layout it left; logged once. Past ``deadline``: :class:`MoveWaitTimeout`."""
        reported, pauses = False, move_poll_pauses()
        with LiveRescale(self.job.replicas) as move:  # one survey's connections for every poll
            while (shown := move.pending_move_info()) is not None:
                if not reported:
                    reported = True
                    log.warning(
                        "micro-batch %d of job %r waits for a live rescale to %d replicas (topology version %d, "
                        "started by %s)",
                        batch_id,
                        self.job.name,
                        shown["replica_count"],
                        shown["version"],
                        shown.get("initiator", "operator"),
                    )
                if time.monotonic() > deadline:
                    raise MoveWaitTimeout(
                        f"micro-batch {batch_id} of job {self.job.name!r} waited {self.move_wait:.0f} s for the live "
                        f"rescale to {shown['replica_count']} replicas (topology version {shown['version']}, started "
                        f"by {shown.get('initiator', 'operator')}): finish it (statehouse rescale --resume) or abort "
                        "it (statehouse rescale --abort)"
                    )
                time.sleep(next(pauses))
        self._relearn()
        if reported:
            log.warning(
                "micro-batch %d of job %r goes on after the live rescale, on %d replicas",
                batch_id,
                self.job.name,
                len(self.job.replicas),
            )

    # -- a micro-batch -----------------------------------------------------------------------

    def begin(self, batch_id: int) -> BatchPlan:
        """Begin an attempt of micro-batch ``batch_id``: a fenced epoch to write under, or a replay."""
        deadline = time.monotonic() + self.move_wait
        relearned = False
        while True:
            try:
                answers = self._fence_next()
            except Unavailable as exc:
                _await_replica(exc, f"micro-batch {batch_id} of job {self.job.name!r}", deadline)
                self._relearn()
                continue
            moving = any(a.get("rescale_version") for a in answers)
            # A layout the client did not learn (a move ended since): learned once; what still differs is no move.
            stale = not relearned and any(a.get("topology_version") != self.job.replicas.version for a in answers)
            if moving or (stale and self.job.replicas.version is not None):
                self._release(answers)  # lets the move's prepare through
                if relearned and time.monotonic() > deadline:
                    raise MoveWaitTimeout(
                        f"micro-batch {batch_id} of job {self.job.name!r} did not begin within {self.move_wait:.0f} s: "
                        "its replicas kept answering a live rescale (statehouse status shows it)"
                    )
                if relearned:
                    time.sleep(0.5)  # a fence saw the move its replicas no longer show: look again
                self._await_move(batch_id, deadline)
                relearned = True
                continue
            restored = self._undo_half_commit(answers)
            if restored is answers:
                break
        applied = self._applied(answers)
        epochs = {answer["epoch"] for answer in answers}
        epoch = max(epochs)
        if len(epochs) > 1:  # one epoch everywhere, still opening the batch
            body = {"epoch": epoch, "begins_batch": True}
            self.job.replicas.on_all("POST", routes.path(routes.FENCE, job=self.job.name), body)
        if batch_id <= applied.batch_id:
            self.abort_epoch(epoch)  # a replay writes nothing: no batch in flight
            return BatchPlan(batch_id, None, replay=True)
        if batch_id > applied.batch_id + 1:
            self.abort_epoch(epoch)
            raise StateBehind(
                f"job {self.job.name!r} state holds micro-batches up to {applied.batch_id}, so batch {batch_id} "
                "cannot be applied exactly once; restore a matching checkpoint or start a new query"
            )
        self.ensure_restore_point(applied, moved=relearned)
        plan = BatchPlan(batch_id, epoch, replay=False, version=self.job.replicas.version)
        self._open = plan
        return plan

    def _release(self, answers: list[dict[str, Any]]) -> None:
        """Abort the epoch each replica's fence answered (a batch that will not begin there)."""
        self._abort_each([answer["epoch"] for answer in answers])

    def _fence_next(self) -> list[dict[str, Any]]:
        """Every replica's writer epoch raised past its own, opening a micro-batch: the fences' answers."""
        body = {"epoch": 0, "next": True, "begins_batch": True}
        return self.job.replicas.on_all("POST", routes.path(routes.FENCE, job=self.job.name), body)

    def commit(self, plan: BatchPlan, messages: Iterable[CommitMessage] = ()) -> GlobalCheckpoint | None:
        """Commit the winning attempts on every replica, then checkpoint the batch."""
        if plan.replay:
            return None
        assert plan.epoch is not None
        self._open = None  # committed or not, this batch is over: a re-run begins again
        batch_id = plan.batch_id if plan.batch_id >= 0 else None  # -1: a write before any micro-batch
        bodies = commit_bodies(winners(messages), len(self.job.replicas), batch_id)
        commit = routes.path(routes.EPOCH_COMMIT, job=self.job.name, epoch=plan.epoch)
        prepare = routes.path(routes.EPOCH_PREPARE, job=self.job.name, epoch=plan.epoch)
        # One replica: its commit checks exactly what its prepare would (the winners' writes, the
        # epoch) under the same lock, and applies all or nothing, so the prepare's round trip is
        # left out. Several: every replica seals before any applies (two phases).
        one_phase = len(self.job.replicas) == 1
        try:
            if one_phase:
                self.job.replicas.on_each("POST", commit, bodies)  # idempotent: safe to retry
            else:
                prepared = self.job.replicas.on_each("POST", prepare, bodies)
                moved = plan.version is not None and any(r["topology_version"] != plan.version for r in prepared)
                if moved:
                    raise MicroBatchLost(  # a move met the batch (a driver silent past the lease): re-run it
                        f"micro-batch {plan.batch_id} was not committed: a live rescale changed the layout during it",
                        code="stale_epoch",
                    )
        except StatehouseError as exc:
            if not one_phase or (exc.status is not None and exc.status < 500):  # else: it may have applied
                self.abort_epoch(plan.epoch)
            if exc.code in ("attempt_lost", "stale_epoch"):
                raise MicroBatchLost(f"micro-batch {plan.batch_id} was not committed: {exc}") from exc
            raise
        if not one_phase:
            self.job.replicas.on_each("POST", commit, bodies)  # idempotent: safe to retry
        return self._checkpoint_batch(plan)

    def _checkpoint_batch(self, plan: BatchPlan) -> GlobalCheckpoint:
        """The committed batch's checkpoint. A live rescale that starts meanwhile can fail it: its
        commit ends the old layout's checkpoints, and its copy's checkpoint, completing first,
        subsumes a pending one. Beside the copy (nothing frozen, the layout as the batch began) it is
        taken again at once, a few times; else once the move has ended, on the new layout, where the
        state still holds the batch."""
        assert plan.epoch is not None
        metadata = {"batch_id": plan.batch_id, "epoch": plan.epoch}
        deadline = time.monotonic() + self.move_wait
        beside_copy = 0
        while True:
            try:
                checkpoint = self.checkpoint(metadata=metadata)
                self._checkpointed_epoch = plan.epoch
                return checkpoint
            except CheckpointFailed as exc:
                moved = self._layout_moved(plan)
                if not moved:
                    raise
                if moved == "copying" and beside_copy < _RETAKES_BESIDE_COPY:
                    beside_copy += 1
                    log.warning(
                        "the checkpoint of micro-batch %d met a live rescale's copy (%s): taken again now",
                        plan.batch_id,
                        exc,
                    )
                    continue
                log.warning(
                    "the checkpoint of micro-batch %d met a live rescale (%s): taken again after it", plan.batch_id, exc
                )
                self._await_move(plan.batch_id, deadline)

    def _layout_moved(self, plan: BatchPlan) -> Literal["copying", "moving", False]:
        """Whether a live rescale is pending (``copying``: only its pre-copy, nothing frozen, every
        replica still on the plan's layout), or committed since the plan's layout (``moving``)."""
        with LiveRescale(self.job.replicas) as move:
            shown = move.pending_move_info()
        if shown is not None and shown.get("phase") != "copying":
            return "moving"
        try:
            versions = {info.get("topology_version") for info in self.job.infos()}
        except StatehouseError:
            return "moving"  # a replica the move retired and stopped
        if versions != {plan.version}:
            return "moving"
        return False if shown is None else "copying"

    def abort_epoch(self, epoch: int) -> None:
        """Drop what ``epoch`` staged, everywhere (best effort: a new epoch drops it anyway)."""
        self._abort_each([epoch] * len(self.job.replicas))

    def _abort_each(self, epochs: list[int]) -> None:
        """Abort ``epochs[i]`` on replica ``i``, best effort: it ends the batch in flight there."""
        for replica, epoch in zip(self.job.replicas, epochs, strict=True):
            with contextlib.suppress(StatehouseError):
                replica.json("POST", routes.path(routes.EPOCH_ABORT, job=self.job.name, epoch=epoch))

    def moved_on(self, plan: BatchPlan) -> bool:
        """Whether the job moved on under the plan: its epoch past the plan's (a restore, or another
        writer fenced it), or its layout changed (a live rescale met the batch)."""
        if plan.epoch is None:
            return False
        return self.job.epoch() > plan.epoch or bool(self._layout_moved(plan))
