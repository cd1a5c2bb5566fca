"""The driver's checkpoint coordinator (the role of Flink's JobManager) and the exactly-once
protocol for Spark micro-batches.

A *global* checkpoint N is complete when every replica has completed its part of N
(client/global_checkpoints.py). Micro-batches anchor on them, and a live rescale
(client/rescale.py) runs between two micro-batches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from statehouse.client.attempts import CommitMessage, commit_bodies, winners
from statehouse.client.errors import StatehouseError
from statehouse.client.global_checkpoints import CheckpointCoordinator, CheckpointFailed, GlobalCheckpoint
from statehouse.client.rescale import LiveRescale, Progress, RescaleReport, decision_record

__all__ = [
    "BatchPlan",
    "CheckpointCoordinator",
    "CheckpointFailed",
    "GlobalCheckpoint",
    "MicroBatchCoordinator",
    "MicroBatchLost",
    "StateBehind",
]


@dataclass(frozen=True)
class BatchPlan:
    """What an attempt of micro-batch ``batch_id`` may do: write with ``epoch``, or, when the batch
    was already applied and checkpointed (``replay``), only read."""

    batch_id: int
    epoch: int | None
    replay: bool


class StateBehind(StatehouseError):
    """The state's last applied micro-batch is older than the one before ``batch_id``."""


class MicroBatchLost(StatehouseError):
    """A replica does not hold the micro-batch's staged writes (it restarted or was restored
    during the batch, or another writer fenced the job): nothing was committed; re-run it."""


class MicroBatchCoordinator(CheckpointCoordinator):
    """Exactly-once state updates for Spark micro-batches, per task attempt.

    Every applied micro-batch ends with a global checkpoint whose metadata records the batch
    id and its epoch. When an attempt of batch ``b`` begins (:meth:`begin`):

    * if the latest complete checkpoint already covers ``b``, the attempt is a *replay*: it
      must not write (its outputs can be recomputed from state);
    * if a replica committed an epoch other than the checkpoint's (a driver died in the
      middle of a commit), every replica is restored to the checkpoint;
    * a new epoch is fenced on every replica: what older attempts staged is dropped, and
      their late writes are refused.

    Tasks then stage their writes under the epoch (``client/spark.py``). :meth:`commit` takes
    the commit messages of the successful tasks, picks one attempt per partition, *prepares*
    every replica (each checks it holds exactly those writes, and seals the epoch), commits
    every replica, and takes the checkpoint for ``b``. A failed prepare aborts everywhere
    and nothing is applied (:class:`MicroBatchLost`: re-run the batch).

    Between two micro-batches, :meth:`rescale` changes the replica count live (client/rescale.py);
    a driver restarting after a crash calls :meth:`recover` first, which finishes or undoes a move
    its predecessor left.
    """

    _open: BatchPlan | None = None  # the micro-batch begun and not yet committed

    def anchor(self) -> GlobalCheckpoint:
        """The latest complete checkpoint that records a batch; right after a live rescale (the
        replicas list only the new layout's checkpoints), the batch the move's checkpoint held,
        carried over to the new layout; a baseline one (batch -1) if none."""
        batch = self._latest_batch()
        if batch is not None:
            return batch
        moved = self._moved_batch()
        if moved is not None:
            return self.carry_over(moved)
        return self.checkpoint(metadata={"batch_id": -1, "epoch": max(self.job.committed_epochs())})

    def _moved_batch(self) -> GlobalCheckpoint | None:
        """The batch the checkpoint of the live rescale to the current layout held, from the move's
        decision record (a driver that died between the commit and the carry-over leaves only that)."""
        version = self.job.replicas.version
        if version is None:
            return None
        try:
            record = decision_record(self.job.replicas[0], version)
        except StatehouseError:  # no move made this version, or a token without @admin
            return None
        if record is None or record.get("outcome") != "commit":
            return None
        metadata = ((record.get("metadata") or {}).get("checkpoint_metadata") or {}).get(self.job.name) or {}
        checkpoint_id = (record.get("checkpoints") or {}).get(self.job.name)
        if "batch_id" not in metadata or checkpoint_id is None:
            return None
        return GlobalCheckpoint(int(checkpoint_id), "checkpoint", metadata, ())

    def _latest_batch(self) -> GlobalCheckpoint | None:
        for candidate in reversed(self.completed()):
            if "batch_id" in candidate.metadata:
                return candidate
        return None

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
        The state moves with one checkpoint that records the last applied batch, and the new layout
        anchors on that batch, so the next micro-batch (and a replay) runs on the new layout."""
        if self._open is not None:
            raise StatehouseError(
                f"micro-batch {self._open.batch_id} is open: rescale between micro-batches (after commit)"
            )
        anchor = self.anchor()
        metadata = {self.job.name: {"batch_id": anchor.metadata["batch_id"], "epoch": anchor.metadata["epoch"]}}
        with LiveRescale(
            self.job.replicas, to, new_urls, wait=wait, progress=progress, checkpoint_metadata=metadata
        ) as move:
            report = move.run()
        if report.outcome == "committed":
            # Each replica lists the checkpoints of its current layout only: anchor the batch there.
            self.carry_over(anchor)
        return report

    def recover(self, anchor: GlobalCheckpoint | None = None) -> list[dict[str, Any]]:
        """Finish a live rescale a dead driver left (forward when commit was decided; aborted when
        not), then undo a commit it left half done (a replica committed an epoch other than the
        anchor's): every replica is restored to the anchor. Returns every replica's job info."""
        if anchor is None:
            self._finish_move()
            anchor = self.anchor()
        return self._undo_half_commit(anchor)

    def _finish_move(self) -> None:
        with LiveRescale(self.job.replicas) as move:
            pending = move.pending()  # (the client now routes to the old replicas)
            if pending is None:
                return
            if pending != "commit":
                move.abort()
                return
            # The move's checkpoint records the batch it holds; read it while the old layout lists it.
            batch = self._latest_batch()
            report = move.resume()
        if batch is not None and report.outcome == "committed":
            self.carry_over(batch)

    def begin(self, batch_id: int) -> BatchPlan:
        anchor = self.anchor()
        applied = anchor.metadata["batch_id"]
        if batch_id <= applied:
            return BatchPlan(batch_id, None, replay=True)
        if batch_id > applied + 1:
            raise StateBehind(
                f"job {self.job.name!r} state holds micro-batches up to {applied}, so batch {batch_id} "
                "cannot be applied exactly once; restore a matching checkpoint or start a new query"
            )
        plan = BatchPlan(batch_id, self._fence_past(anchor), replay=False)
        self._open = plan
        return plan

    def _fence_past(self, anchor: GlobalCheckpoint) -> int:
        """Fence a new epoch on every replica, past any it had, in one round trip when all goes
        well: each fence answers the replica's committed epoch, and a replica that committed an
        epoch other than the anchor's (a driver died in the middle of a commit) has every replica
        restored to the anchor, then fenced again."""
        at_least = anchor.metadata["epoch"] + 1
        fenced = self._restored_if_half_committed(anchor, lambda: self._fence_next(at_least))
        epochs = {answer["epoch"] for answer in fenced}
        return self.job.fence(max(epochs)) if len(epochs) > 1 else epochs.pop()

    def _fence_next(self, at_least: int) -> list[dict[str, Any]]:
        """Every replica's writer epoch raised past its own (and to ``at_least``): the fences' answers."""
        return self.job.replicas.on_all("POST", f"/v1/jobs/{self.job.name}/fence", {"epoch": at_least, "next": True})

    def _undo_half_commit(self, anchor: GlobalCheckpoint) -> list[dict[str, Any]]:
        return self._restored_if_half_committed(anchor, self.job.infos)

    def _restored_if_half_committed(
        self, anchor: GlobalCheckpoint, read: Callable[[], list[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """``read()``'s answers, one per replica, each with its ``committed_epoch``; when a replica
        committed an epoch other than the anchor's (a driver died in the middle of a commit), every
        replica is restored to the anchor first and read again (the restore moved the epochs)."""
        answers = read()
        if any(answer["committed_epoch"] != anchor.metadata["epoch"] for answer in answers):
            self.restore(anchor.checkpoint_id)
            answers = read()
        return answers

    def commit(self, plan: BatchPlan, messages: Iterable[CommitMessage] = ()) -> GlobalCheckpoint | None:
        """Commit the winning attempts on every replica, then checkpoint the batch."""
        if plan.replay:
            return None
        assert plan.epoch is not None
        self._open = None  # committed or not, this batch is over: a re-run begins again
        bodies = commit_bodies(winners(messages), len(self.job.replicas))
        path = f"/v1/jobs/{self.job.name}/epochs/{plan.epoch}"
        # One replica: its commit checks exactly what its prepare would (the winners' writes, the
        # epoch) under the same lock, and applies all or nothing, so the prepare's round trip is
        # left out. Several: every replica seals before any applies (two phases).
        one_phase = len(self.job.replicas) == 1
        try:
            if one_phase:
                self.job.replicas.on_each("POST", f"{path}/commit", bodies)  # idempotent: safe to retry
            else:
                self.job.replicas.on_each("POST", f"{path}/prepare", bodies)
        except StatehouseError as exc:
            if not one_phase or (exc.status is not None and exc.status < 500):  # else: it may have applied
                self.abort_epoch(plan.epoch)
            if exc.code in ("attempt_lost", "stale_epoch"):
                raise MicroBatchLost(f"micro-batch {plan.batch_id} was not committed: {exc}") from exc
            raise
        if not one_phase:
            self.job.replicas.on_each("POST", f"{path}/commit", bodies)  # idempotent: safe to retry
        return self.checkpoint(metadata={"batch_id": plan.batch_id, "epoch": plan.epoch})

    def abort_epoch(self, epoch: int) -> None:
        """Drop what ``epoch`` staged, everywhere (best effort: a new epoch drops it anyway)."""
        for replica in self.job.replicas:
            with contextlib.suppress(StatehouseError):
                replica.json("POST", f"/v1/jobs/{self.job.name}/epochs/{epoch}/abort")

    def moved_on(self, plan: BatchPlan) -> bool:
        """Whether the job's epoch moved past the plan's (a restore, or another writer fenced it)."""
        return plan.epoch is not None and self.job.epoch() > plan.epoch

    def carry_over(self, source: GlobalCheckpoint) -> GlobalCheckpoint:
        """After restoring a savepoint into a new deployment (rescale), anchor its batch there."""
        metadata = {"batch_id": source.metadata.get("batch_id", -1), "epoch": max(self.job.committed_epochs())}
        return self.checkpoint(metadata=metadata)
