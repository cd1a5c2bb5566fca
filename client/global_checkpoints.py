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

    def _listings(self, every_layout: bool = False) -> list[list[dict[str, Any]]]:
        return [items for items, _next_id in self._pages(every_layout)]

    def _pages(self, every_layout: bool = False) -> list[tuple[list[dict[str, Any]], int]]:
        listings = []
        for replica in self.job.replicas:
            items, cursor = [], None
            while True:
                params = f"?limit=1000&cursor={cursor}" if cursor else "?limit=1000"
                if every_layout:
                    params += "&layouts=all"
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
