"""The driver's checkpoint coordinator (the role of Flink's JobManager).

A *global* checkpoint N is complete when every replica has completed its part of N. The
coordinator triggers N on every replica, waits until every part is uploaded, then completes
it everywhere — or aborts it everywhere on any failure. (client/coordinator.py builds the
micro-batch protocol on it, client/rescale.py the live rescale.)
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statehouse.client.errors import StatehouseError
from statehouse.client.paging import listing
from statehouse.protocol import routes

if TYPE_CHECKING:
    from statehouse.client.job import JobClient
    from statehouse.client.transport import ReplicaConnection


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
# A listed id another coordinator's checkpoint took first (a query's beside a move's) is listed
# again, up to this many times in all, each time skipping further ahead (by 1, 3, 7, ... ids; ids
# need only increase): a coordinator whose listings are slower than the other's checkpoints
# (replicas busy uploading a big job) gets ahead of them instead of losing every race.
_TRIGGER_ATTEMPTS = 6


def _uploading(info: dict[str, Any]) -> bool:
    """Whether a part's trigger answered before its upload ended (a failed upload is seen by the wait)."""
    return info["status"] not in ("uploaded", "completed")


class CheckpointCoordinator:
    """The global checkpoints of one job (Flink's ``CheckpointCoordinator``): triggers a checkpoint
    or savepoint on every replica, waits for every part's upload and completes it everywhere, or
    aborts it everywhere; lists those every replica completed; restores every replica from one.
    ``timeout`` bounds a checkpoint from its trigger to the end of its last upload."""

    def __init__(self, job: JobClient, *, timeout: float = 300.0, poll_interval: float = 0.05) -> None:
        self.job = job
        self.timeout = timeout
        self.poll_interval = poll_interval
        # The next id every replica takes, from this coordinator's last listing or checkpoint (a
        # micro-batch's begin lists them: its checkpoint needs no second listing). A stale one is
        # refused whole (checkpoint_conflict) and asked afresh.
        self._next_listed: int | None = None

    def _path(self, template: str = routes.CHECKPOINTS, **params: object) -> str:
        return routes.path(template, job=self.job.name, **params)

    def _listings(self, every_layout: bool = False) -> list[list[dict[str, Any]]]:
        return [items for items, _next_id in self._pages(every_layout)]

    def _pages(self, every_layout: bool = False) -> list[tuple[list[dict[str, Any]], int]]:
        """Per replica, its checkpoints and the next id it takes (the last page's); the replicas
        asked at once (each lists its storage, and for ``every_layout`` reads metadata there)."""
        query = {"layouts": "all"} if every_layout else {}

        def pages(replica: ReplicaConnection) -> tuple[list[dict[str, Any]], int]:
            items: list[dict[str, Any]] = []
            for page in listing(replica, self._path(), query):
                items += page["items"]
            return items, page["next_checkpoint_id"]

        replicas = self.job.replicas
        listings = [future.result() for future in [replicas.submit(pages, replica) for replica in replicas]]
        self._next_listed = max((next_id for _items, next_id in listings), default=None)
        return listings

    def next_id(self) -> int:
        """An id no replica has used (ids keep growing across restarts and rescales)."""
        return max(next_id for _items, next_id in self._pages())

    def completed(self, *, every_layout: bool = False) -> list[GlobalCheckpoint]:
        """Checkpoints and savepoints completed on every replica, oldest first. ``every_layout``: also
        those every replica of an earlier layout completed (before a rescale), which restore here too."""
        per_replica = [
            {c["checkpoint_id"]: c for c in listing if c["status"] == "completed"}
            for listing in self._listings(every_layout)
        ]
        ids = set.intersection(*(set(d) for d in per_replica)) if per_replica else set()
        result = []
        for checkpoint_id in sorted(ids):
            parts = tuple(d[checkpoint_id] for d in per_replica)
            result.append(GlobalCheckpoint(checkpoint_id, parts[0]["kind"], parts[0].get("metadata") or {}, parts))
        return result

    def latest(self, kind: str | None = None, *, every_layout: bool = False) -> GlobalCheckpoint | None:
        """The newest of :meth:`completed` (of ``kind``, if given). ``every_layout``: the newest a
        restore can take, of this layout or an earlier one (``statehouse status`` shows it, the last
        line of ``statehouse checkpoints``); ids only grow across rescales, so it is the newest taken."""
        done = [c for c in self.completed(every_layout=every_layout) if kind is None or c.kind == kind]
        return done[-1] if done else None

    def checkpoint(
        self, checkpoint_id: int | None = None, *, kind: str = "checkpoint", metadata: dict[str, Any] | None = None
    ) -> GlobalCheckpoint:
        """Trigger on every replica, wait for every upload, complete everywhere; abort everywhere on failure.

        Flink's trigger, acknowledge and notify-complete in as few round trips as keep its rule (no
        part completes before every part is uploaded): the trigger waits for the upload (a long
        poll), and a deployment of one replica completes in that request too. Without
        ``checkpoint_id``, the next id the last listing gave (a micro-batch's begin lists them), or
        a new listing's."""
        deadline = time.monotonic() + self.timeout  # the trigger's own wait counts too
        wait_ms = min(_LONG_POLL_MS, int(self.timeout * 1000))
        body: dict[str, Any] = {"kind": kind, "metadata": metadata or {}, "wait_ms": wait_ms}
        if len(self.job.replicas) == 1:
            body["complete"] = True
        checkpoint_id, infos = self._triggered(checkpoint_id, body)
        try:
            if any(info["status"] != "completed" for info in infos):
                uploading = [r for r, info in zip(self.job.replicas, infos, strict=True) if _uploading(info)]
                self._wait_uploaded(checkpoint_id, uploading, deadline)
                infos = self.job.replicas.on_all(
                    "POST", self._path(routes.CHECKPOINT_COMPLETE, checkpoint_id=checkpoint_id)
                )
        except Exception as exc:
            self.abort(checkpoint_id)
            raise CheckpointFailed(f"checkpoint {checkpoint_id} of job {self.job.name!r} failed: {exc}") from exc
        return GlobalCheckpoint(checkpoint_id, kind, metadata or {}, tuple(infos))

    def _triggered(self, checkpoint_id: int | None, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        """Trigger the checkpoint on every replica: its id and every replica's answer. On a failure,
        abort it everywhere but where another's checkpoint of that id refused the trigger, and raise
        CheckpointFailed; a listed id another checkpoint took since is listed again, skipping ahead."""
        listed, skip = checkpoint_id is None, 0
        for attempt in range(_TRIGGER_ATTEMPTS):
            if checkpoint_id is None:
                checkpoint_id = (self._next_listed or self.next_id()) + skip
            body["checkpoint_id"] = checkpoint_id
            self._next_listed = checkpoint_id + 1  # taken, or another's: either way not free
            replicas = list(self.job.replicas)
            futures = [self.job.replicas.submit(r.json, "POST", self._path(), body, idempotent=False) for r in replicas]
            answers: list[dict[str, Any]] = []
            refused: list[StatehouseError] = []
            for replica, future in zip(replicas, futures, strict=True):
                try:
                    answers.append(future.result())
                except StatehouseError as exc:
                    if exc.code == "checkpoint_not_ready":  # triggered; still uploading when the complete gave up
                        answers.append({"checkpoint_id": checkpoint_id, "status": "in_progress"})
                        continue
                    refused.append(exc)
                    if exc.code == "checkpoint_conflict":
                        continue  # the id is another checkpoint's there: leave that one be
                    with contextlib.suppress(StatehouseError):
                        replica.json("POST", self._path(routes.CHECKPOINT_ABORT, checkpoint_id=checkpoint_id))
            if not refused:
                return checkpoint_id, answers
            for replica, future in zip(replicas, futures, strict=True):
                if future.exception() is None:  # this one took it: the checkpoint is ours there
                    with contextlib.suppress(StatehouseError):
                        replica.json("POST", self._path(routes.CHECKPOINT_ABORT, checkpoint_id=checkpoint_id))
            last = attempt + 1 == _TRIGGER_ATTEMPTS
            if listed and not last and all(e.code == "checkpoint_conflict" for e in refused):
                checkpoint_id = None  # listed before another checkpoint took it: list again
                self._next_listed, skip = None, 2 * skip + 1
                continue
            raise CheckpointFailed(
                f"checkpoint {checkpoint_id} of job {self.job.name!r} could not be triggered: {refused[0]}"
            ) from refused[0]
        raise AssertionError("unreachable")

    def savepoint(self, checkpoint_id: int | None = None, *, metadata: dict[str, Any] | None = None):
        return self.checkpoint(checkpoint_id, kind="savepoint", metadata=metadata)

    def _wait_uploaded(self, checkpoint_id: int, pending: list[ReplicaConnection], deadline: float) -> None:
        """Until the upload of every replica in ``pending`` has ended, or ``deadline``: a long poll
        per replica (``wait_ms``), which answers as soon as its upload ends."""
        while pending:
            still = []
            for replica in pending:
                wait_ms = max(0, min(_LONG_POLL_MS, int((deadline - time.monotonic()) * 1000)))
                asked = time.monotonic()
                path = self._path(routes.CHECKPOINT, checkpoint_id=checkpoint_id)
                info = replica.json("GET", f"{path}?wait_ms={wait_ms}")
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
                replica.json("POST", self._path(routes.CHECKPOINT_ABORT, checkpoint_id=checkpoint_id))

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
        return self.job.replicas.on_all("POST", self._path(routes.RESTORE), body)
