"""Micro-batches of the exactly-once protocol driven by hand, without Spark: a task attempt's
writes, the totals they leave, and the check that a lost attempt fails its batch whole.

Only the client is imported: ``tests/client`` uses this where only the client wheel is installed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pytest

from statehouse.client.attempts import TaskAttempt
from statehouse.client.coordinator import MicroBatchLost

if TYPE_CHECKING:
    from statehouse.client.attempts import CommitMessage
    from statehouse.client.coordinator import BatchPlan, MicroBatchCoordinator
    from statehouse.client.job import JobClient

KEYS = [f"user-{i}" for i in range(20)]


def totals(job: JobClient, keys: Iterable[str]) -> dict[str, Any]:
    """The reducing state ``total`` of each key (``None`` where it has none)."""
    with job.batch() as reads:
        pending = {k: reads.get("total", k) for k in keys}
    return {k: p.value for k, p in pending.items()}


def task(
    job: JobClient, plan: BatchPlan, partition: int, amount: float, keys: Iterable[str] = KEYS, task_id: int = 0
) -> CommitMessage:
    """One task attempt adding ``amount`` to each key's ``total``; returns its commit message."""
    attempt = TaskAttempt(plan.epoch, partition, len(job.replicas), unit="u", task=task_id)
    with job.batch(attempt=attempt) as writes:
        for k in keys:
            writes.add("total", k, amount)
    return attempt.message()


def check_a_replica_without_the_staged_writes_fails_the_batch(
    job: JobClient, coordinator: MicroBatchCoordinator
) -> None:
    """The last replica loses the attempt's staged writes (as if it restarted): the commit fails
    whole, nothing is applied anywhere (on the other replicas neither), and a retry applies once."""
    plan = coordinator.begin(0)
    message = task(job, plan, 0, 1)
    job.replicas[-1].json("POST", f"/v1/jobs/{job.name}/epochs/{plan.epoch}/abort")  # as if it restarted
    with pytest.raises(MicroBatchLost, match="attempt_lost"):
        coordinator.commit(plan, [message])
    assert set(totals(job, KEYS).values()) == {None}
    retry = coordinator.begin(0)
    coordinator.commit(retry, [task(job, retry, 0, 1)])
    assert set(totals(job, KEYS).values()) == {1}
