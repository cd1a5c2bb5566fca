"""A job's timers from the client (Flink's ``TimerService``): register and delete per key on the
replica that owns it, advance every replica's watermark or clock and collect the fired timers in
firing order, list and count them. See docs/api.md#timers for the rules."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statehouse.client.errors import StatehouseError
from statehouse.client.paging import listed
from statehouse.protocol import routes
from statehouse.protocol.keygroups import KeyGroupRange

if TYPE_CHECKING:
    from statehouse.client.attempts import TaskAttempt
    from statehouse.client.timer_columns import TimerJob


@dataclass(frozen=True, slots=True)
class Timer:
    """A timer as a replica reports it (fired, or listed)."""

    timestamp: int
    key: str | int
    key_type: str
    ns: str
    key_group: int

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timer:
        return cls(data["timestamp"], data["key"], data["key_type"], data["ns"], data["key_group"])


class TimerServiceHandle:
    """The timers of one time domain (``event`` or ``processing``) of a job, on every replica."""

    def __init__(self, job: TimerJob, domain: str = "event") -> None:
        if domain not in ("event", "processing"):
            raise ValueError(f"domain must be 'event' or 'processing'; got {domain!r}")
        self._job = job
        self.domain = domain
        self._path = routes.path(routes.TIMERS, job=job.name, domain=domain)
        self._advance = routes.path(routes.TIMER_ADVANCE, job=job.name, domain=domain)
        self._counts = routes.path(routes.TIMER_COUNTS, job=job.name, domain=domain)

    def register(self, key: Any, timestamp: int, ns: str = "", key_type: str = "string") -> None:
        """Register a timer (a no-op when it exists); a timer at or below the replica's current
        time fires on its next advance."""
        with self._job.batch() as batch:
            batch.register_timer(key, timestamp, ns, domain=self.domain, key_type=key_type)

    def delete(self, key: Any, timestamp: int, ns: str = "", key_type: str = "string") -> None:
        with self._job.batch() as batch:
            batch.delete_timer(key, timestamp, ns, domain=self.domain, key_type=key_type)

    def register_many(
        self,
        keys: Any,
        timestamps: Any,
        ns: Any = "",
        *,
        key_type: str = "string",
        attempt: TaskAttempt | None = None,
        epoch: int | None = None,
    ) -> int:
        """Register one timer per row (keys and timestamps as pandas, numpy, Arrow or lists; ``ns``
        one string or a column), one Arrow request per replica; with a task ``attempt`` the rows
        are staged (each one write). Needs the client's ``columnar`` extra. Returns the rows."""
        return self._many("register", keys, timestamps, ns, key_type, attempt, epoch)

    def delete_many(
        self,
        keys: Any,
        timestamps: Any,
        ns: Any = "",
        *,
        key_type: str = "string",
        attempt: TaskAttempt | None = None,
        epoch: int | None = None,
    ) -> int:
        """:meth:`register_many`, deleting."""
        return self._many("delete", keys, timestamps, ns, key_type, attempt, epoch)

    def _many(
        self,
        op: str,
        keys: Any,
        timestamps: Any,
        ns: Any,
        key_type: str,
        attempt: TaskAttempt | None,
        epoch: int | None,
    ) -> int:
        import statehouse.client.timer_columns as timer_columns  # pyarrow, numpy and pandas load only here

        max_rows = self._job.replicas.config.max_batch_ops
        return timer_columns.send(
            self._job, self.domain, op, keys, timestamps, ns, key_type, attempt=attempt, epoch=epoch, max_rows=max_rows
        )

    def advance(
        self,
        to: int,
        *,
        epoch: int | None = None,
        attempt: TaskAttempt | None = None,
        key_groups: KeyGroupRange | None = None,
    ) -> list[Timer]:
        """Raise every replica's time to ``to`` (never lowering it) and return the timers that
        fired, in (timestamp, key group, key, namespace) order. ``epoch`` fences; with a task
        ``attempt`` the firing is staged (one write per request) and counts once the driver
        commits the attempt. ``key_groups`` fires only those key groups (a Spark partition's),
        on the replicas that own some of them."""
        replicas = [
            r
            for r in range(len(self._job.replicas))
            if key_groups is None or len(self._job.key_group_range(r).intersection(key_groups))
        ]
        futures = [
            self._job.replicas.send_in_order(r, self._advance_one, r, to, epoch, attempt, key_groups) for r in replicas
        ]
        fired = [future.result() for future in futures]
        return list(heapq.merge(*fired, key=lambda t: (t.timestamp, t.key_group)))

    def _advance_one(
        self, replica: int, to: int, epoch: int | None, attempt: TaskAttempt | None, key_groups: KeyGroupRange | None
    ) -> list[Timer]:
        """One replica's advance, repeated while it says more timers are due (its answers are
        capped); in order, on the replica's own sender thread, as a task attempt's seqs need."""
        connection = self._job.replicas[replica]
        fired: list[Timer] = []
        while True:
            body: dict[str, Any] = {"to": to}
            if key_groups is not None:
                body["key_groups"] = key_groups.as_list()
            if attempt is not None:
                body.update(attempt.fields(replica))
            elif epoch is not None:
                body["epoch"] = epoch
            try:
                # Only a task attempt's advance may be re-sent: its seq answers the same timers again.
                answer = connection.json("POST", self._advance, body, idempotent=attempt is not None)
            except StatehouseError as exc:
                if attempt is not None and 400 <= (exc.status or 0) < 500:
                    attempt.refused(replica, body["seq"])
                raise
            if attempt is not None:
                attempt.answered(replica, 1)
            fired += [Timer.from_dict(t) for t in answer["timers"]]
            if not answer["more"]:
                return fired

    def counts(self) -> dict[int, int]:
        """Stored timers per key group, over every replica (key groups without timers left out)."""
        answers = self._job.replicas.on_all("GET", self._counts)
        return {c["key_group"]: c["count"] for answer in answers for c in answer["key_groups"]}

    def times(self) -> list[int | None]:
        """Each replica's current time of this domain (``None`` before its first advance)."""
        return [answer["time"] for answer in self._job.replicas.on_all("GET", self._counts)]

    def list(self, key_group: int | None = None, page_size: int = 1000) -> Iterator[Timer]:
        """The stored timers, replica after replica (so in key-group order), each key group's in
        firing order; ``key_group`` lists one key group only (on its owner)."""
        replicas: list[int] = list(range(len(self._job.replicas)))
        if key_group is not None:
            replicas = [r for r in replicas if key_group in self._job.key_group_range(r)]
        params = {"key_group": key_group} if key_group is not None else {}
        for replica in replicas:
            for item in listed(self._job.replicas[replica], self._path, params, limit=page_size):
                yield Timer.from_dict(item)
