"""Task attempts: the unit of exactly-once, as in Spark's DataSource V2 write protocol.

A task attempt writes under ``(epoch, partition, attempt)``; the server stages its writes
(read-your-writes for the attempt, invisible to everyone else). When the attempt's partition
is done it produces a *commit message*: who it was and how many writes it staged on each
replica. Spark hands the driver the messages of successful tasks only; the driver picks one
attempt per partition (:func:`winners`) and commits exactly those on every replica.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class CommitMessage:
    """What a finished task attempt tells the driver (plain data: it travels through Spark)."""

    unit: str  # the state update (one ``with_state`` call): with ``partition``, the unit of work
    partition: int
    task: int  # Spark's task attempt id (unique in the application): one task, one id
    attempt: str  # this attempt's id towards Statehouse
    ops: tuple[int, ...]  # write operations staged, per replica index

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "partition": self.partition,
            "task": self.task,
            "attempt": self.attempt,
            "ops": list(self.ops),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommitMessage:
        return cls(data["unit"], data["partition"], data["task"], data["attempt"], tuple(data["ops"]))


@dataclass
class TaskAttempt:
    """One task attempt's session with Statehouse: its id, and per replica the ``seq`` of its
    next request and the writes the replica acknowledged. Thread-safe (a batch sends to
    several replicas at once)."""

    epoch: int
    partition: int
    replica_count: int
    unit: str = ""
    task: int = 0
    attempt: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    _next_seq: list[int] = field(init=False)
    _writes: list[int] = field(init=False)
    _reported: list[int] = field(init=False)  # of _writes, what unreported() handed out already
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._next_seq = [0] * self.replica_count
        self._writes = [0] * self.replica_count
        self._reported = [0] * self.replica_count

    @classmethod
    def of_spark_task(cls, epoch: int, replica_count: int, unit: str) -> TaskAttempt:
        """The attempt of the Spark task this runs in (on an executor), updating state for ``unit``."""
        from pyspark import TaskContext  # only ever called inside a Spark task

        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("not inside a Spark task: use with_state(ctx, fn) in rdd.mapPartitions")
        partition, task = ctx.partitionId(), ctx.taskAttemptId()
        attempt = f"{unit}.p{partition}.t{task}.{uuid.uuid4().hex[:8]}"
        return cls(epoch, partition, replica_count, unit=unit, task=task, attempt=attempt)

    def fields(self, replica: int) -> dict[str, Any]:
        """The attempt fields of the next request to ``replica`` (takes its ``seq``)."""
        with self._lock:
            seq = self._next_seq[replica]
            self._next_seq[replica] += 1
        return {"epoch": self.epoch, "partition": self.partition, "attempt": self.attempt, "seq": seq}

    def answered(self, replica: int, writes: int) -> None:
        with self._lock:
            self._writes[replica] += writes

    def refused(self, replica: int, seq: int) -> None:
        """The replica refused request ``seq`` (nothing of it was staged): reuse the seq."""
        with self._lock:
            if self._next_seq[replica] == seq + 1:
                self._next_seq[replica] = seq

    def message(self) -> CommitMessage:
        with self._lock:
            return CommitMessage(self.unit, self.partition, self.task, self.attempt, tuple(self._writes))

    def unreported(self) -> CommitMessage:
        """The writes acknowledged since the last call (all of them at the first), as a commit
        message: a task that cannot tell its last piece of work (``applyInPandas`` calls a
        function per group) reports as it goes, and the driver adds the parts up (:func:`merged`)."""
        with self._lock:
            ops = tuple(w - r for w, r in zip(self._writes, self._reported, strict=True))
            self._reported = list(self._writes)
            return CommitMessage(self.unit, self.partition, self.task, self.attempt, ops)


def merged(messages: Iterable[CommitMessage]) -> list[CommitMessage]:
    """One message per attempt, in first-seen order: the parts an attempt reported, added up."""
    by_attempt: dict[tuple[str, int, int, str], CommitMessage] = {}
    for m in messages:
        key = (m.unit, m.partition, m.task, m.attempt)
        seen = by_attempt.get(key)
        if seen is None:
            by_attempt[key] = m
        else:
            by_attempt[key] = dataclasses.replace(seen, ops=tuple(a + b for a, b in zip(seen.ops, m.ops, strict=True)))
    return list(by_attempt.values())


def winners(messages: Iterable[CommitMessage]) -> list[CommitMessage]:
    """One successful task per unit of work (state update, partition): the first by task id.

    Spark reports a result task's messages once, but a shuffle-map task's for every attempt
    that succeeded (speculative copies, stage re-runs), and an RDD used by two actions is
    computed twice. Those attempts saw the same input and the same state (staged writes are
    private), so any one of them is the partition's outcome; all invocations inside the
    chosen task commit together.
    """
    chosen: dict[tuple[str, int], int] = {}
    listed = merged(messages)
    for m in listed:
        unit = (m.unit, m.partition)
        chosen[unit] = min(chosen.get(unit, m.task), m.task)
    return sorted(
        (m for m in listed if chosen[(m.unit, m.partition)] == m.task), key=lambda m: (m.partition, m.attempt)
    )


def commit_bodies(chosen: list[CommitMessage], replica_count: int, batch_id: int | None = None) -> list[dict[str, Any]]:
    """Per replica, the prepare/commit body naming the winners that wrote there (and the
    micro-batch they are, which the commit records with them)."""
    return [
        {
            "attempts": [
                {"partition": m.partition, "attempt": m.attempt, "ops": m.ops[replica], "unit": m.unit}
                for m in chosen
                if m.ops[replica]
            ],
            "batch_id": batch_id,
        }
        for replica in range(replica_count)
    ]
