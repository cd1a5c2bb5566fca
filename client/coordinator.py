"""The driver's checkpoint coordinator (the role of Flink's JobManager) and the exactly-once
protocol for Spark micro-batches.

A *global* checkpoint N is complete when every replica has completed its part of N. The
coordinator triggers N on every replica, waits until every part is uploaded, then completes
it everywhere — or aborts it everywhere on any failure.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statehouse.client.attempts import CommitMessage, commit_bodies, winners
from statehouse.client.errors import StatehouseError

if TYPE_CHECKING:
    from statehouse.client.job import JobClient


class CheckpointFailed(StatehouseError):
    """A global checkpoint could not be completed on every replica (it was aborted)."""


@dataclass(frozen=True)
class GlobalCheckpoint:
    """Checkpoint or savepoint ``checkpoint_id``, completed on every replica."""

    checkpoint_id: int
    kind: str
    metadata: dict[str, Any]
    parts: tuple[dict[str, Any], ...]  # each replica's checkpoint info, in replica order

    @property
    def bytes_uploaded(self) -> int:
        return sum(p.get("bytes_uploaded", 0) for p in self.parts)


_LONG_POLL_MS = 5_000  # one wait of a replica's checkpoint (the server's limit is 10 s)


class CheckpointCoordinator:
    def __init__(self, job: JobClient, *, timeout: float = 300.0, poll_interval: float = 0.05) -> None:
        self.job = job
        self.timeout = timeout
        self.poll_interval = poll_interval

    def _path(self, suffix: str = "") -> str:
        return f"/v1/jobs/{self.job.name}/checkpoints{suffix}"

    def _listings(self) -> list[list[dict[str, Any]]]:
        return [items for items, _next_id in self._pages()]

    def _pages(self) -> list[tuple[list[dict[str, Any]], int]]:
        listings = []
        for replica in self.job.replicas:
            items, cursor = [], None
            while True:
                params = f"?limit=1000&cursor={cursor}" if cursor else "?limit=1000"
                page = replica.json("GET", self._path(params))
                items += page["items"]
                cursor = page["next_cursor"]
                if cursor is None:
                    break
            listings.append((items, page["next_checkpoint_id"]))
        return listings

    def next_id(self) -> int:
        """An id no replica has used (ids keep growing across restarts and rescales)."""
        return max(next_id for _items, next_id in self._pages())

    def completed(self) -> list[GlobalCheckpoint]:
        """Checkpoints and savepoints completed on every replica, oldest first."""
        per_replica = [
            {c["checkpoint_id"]: c for c in listing if c["status"] == "completed"} for listing in self._listings()
        ]
        ids = set.intersection(*(set(d) for d in per_replica)) if per_replica else set()
        result = []
        for checkpoint_id in sorted(ids):
            parts = tuple(d[checkpoint_id] for d in per_replica)
            result.append(GlobalCheckpoint(checkpoint_id, parts[0]["kind"], parts[0].get("metadata") or {}, parts))
        return result

    def latest(self, kind: str | None = None) -> GlobalCheckpoint | None:
        done = [c for c in self.completed() if kind is None or c.kind == kind]
        return done[-1] if done else None

    def checkpoint(
        self, checkpoint_id: int | None = None, *, kind: str = "checkpoint", metadata: dict[str, Any] | None = None
    ) -> GlobalCheckpoint:
        """Trigger on every replica, wait for every upload, complete everywhere; abort everywhere on failure."""
        checkpoint_id = checkpoint_id or self.next_id()
        body = {"checkpoint_id": checkpoint_id, "kind": kind, "metadata": metadata or {}}
        try:
            self.job.replicas.on_all("POST", self._path(), body, idempotent=False)
            self._wait_uploaded(checkpoint_id)
            parts = self.job.replicas.on_all("POST", self._path(f"/{checkpoint_id}/complete"))
        except Exception as exc:
            self.abort(checkpoint_id)
            raise CheckpointFailed(f"checkpoint {checkpoint_id} of job {self.job.name!r} failed: {exc}") from exc
        return GlobalCheckpoint(checkpoint_id, kind, metadata or {}, tuple(parts))

    def savepoint(self, checkpoint_id: int | None = None, *, metadata: dict[str, Any] | None = None):
        return self.checkpoint(checkpoint_id, kind="savepoint", metadata=metadata)

    def _wait_uploaded(self, checkpoint_id: int) -> None:
        """Until every replica's upload has ended: a long poll per replica (``wait_ms``), which
        answers as soon as its upload ends."""
        deadline = time.monotonic() + self.timeout
        pending = list(self.job.replicas)
        while pending:
            still = []
            for replica in pending:
                wait_ms = max(0, min(_LONG_POLL_MS, int((deadline - time.monotonic()) * 1000)))
                asked = time.monotonic()
                info = replica.json("GET", self._path(f"/{checkpoint_id}?wait_ms={wait_ms}"))
                if info["status"] in ("failed", "aborted"):
                    raise CheckpointFailed(
                        f"{replica.url}: checkpoint {checkpoint_id} {info['status']}: {info['error']}"
                    )
                if info["status"] == "in_progress":
                    still.append(replica)
                    if time.monotonic() - asked < wait_ms / 2000:  # answered at once: a server without long polls
                        time.sleep(self.poll_interval)
            pending = still
            if pending and time.monotonic() > deadline:
                raise CheckpointFailed(f"checkpoint {checkpoint_id} not uploaded within {self.timeout}s")

    def abort(self, checkpoint_id: int) -> None:
        """Best effort, like Flink's notifyCheckpointAborted."""
        for replica in self.job.replicas:
            with contextlib.suppress(StatehouseError):
                replica.json("POST", self._path(f"/{checkpoint_id}/abort"))

    def restore(
        self,
        checkpoint_id: int | None = None,
        *,
        location: str | None = None,
        operator_parallelism: dict[str, int] | None = None,
    ) -> list[dict[str, Any]]:
        """Restore every replica (each takes its own key groups, whatever replica count wrote the snapshot)."""
        body: dict[str, Any] = {}
        if checkpoint_id is not None:
            body["checkpoint_id"] = checkpoint_id
        if location is not None:
            body["location"] = location
        if operator_parallelism:
            body["operator_parallelism"] = operator_parallelism
        return self.job.replicas.on_all("POST", f"/v1/jobs/{self.job.name}/restore", body)


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
    """

    def anchor(self) -> GlobalCheckpoint:
        """The latest complete checkpoint that records a batch; a baseline one (batch -1) if none."""
        for candidate in reversed(self.completed()):
            if "batch_id" in candidate.metadata:
                return candidate
        return self.checkpoint(metadata={"batch_id": -1, "epoch": max(self.job.committed_epochs())})

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
        infos = self.recover(anchor)
        return BatchPlan(batch_id, self.job.fence(max(info["epoch"] for info in infos) + 1), replay=False)

    def recover(self, anchor: GlobalCheckpoint) -> list[dict[str, Any]]:
        """Undo a commit a dead driver left half done (a replica committed an epoch other than the
        anchor's): every replica is restored to the anchor. Returns every replica's job info."""
        infos = self.job.infos()  # one read for both epochs (a round trip per micro-batch)
        if any(info["committed_epoch"] != anchor.metadata["epoch"] for info in infos):
            self.restore(anchor.checkpoint_id)
            infos = self.job.infos()  # the restore moved the writer epochs
        return infos

    def commit(self, plan: BatchPlan, messages: Iterable[CommitMessage] = ()) -> GlobalCheckpoint | None:
        """Commit the winning attempts on every replica, then checkpoint the batch."""
        if plan.replay:
            return None
        assert plan.epoch is not None
        bodies = commit_bodies(winners(messages), len(self.job.replicas))
        path = f"/v1/jobs/{self.job.name}/epochs/{plan.epoch}"
        try:
            self.job.replicas.on_each("POST", f"{path}/prepare", bodies)
        except StatehouseError as exc:
            self.abort_epoch(plan.epoch)
            if exc.code in ("attempt_lost", "stale_epoch"):
                raise MicroBatchLost(f"micro-batch {plan.batch_id} was not committed: {exc}") from exc
            raise
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
