"""The micro-batch protocol on a deployment of one replica, where it folds round trips:
the commit without a prepare (it checks the same, all or nothing), the checkpoint's trigger that
waits for its upload and completes it, the next id from begin's listing; the driver failing or
dying at each new boundary. A real server (the steps shared with two replicas are
in tests/client/test_exactly_once.py)."""

import pytest

from statehouse.client import StaleEpoch, StatehouseClient
from statehouse.client.attempts import commit_bodies, winners
from statehouse.client.coordinator import Applied, MicroBatchCoordinator
from tests.support.micro_batches import KEYS, check_a_replica_without_the_staged_writes_fails_the_batch, task, totals

pytestmark = [pytest.mark.http]


@pytest.fixture
def single(server, job_name):
    client = StatehouseClient([server.url])
    job = client.create_job(job_name, max_parallelism=128)
    job.register("total", "reducing", function="sum")
    yield job, MicroBatchCoordinator(job)
    client.close()


def test_one_replica_commits_in_one_phase_and_checkpoints_without_a_listing(single, sent):
    job, coordinator = single
    coordinator.commit(first := coordinator.begin(0), [task(job, first, 0, 1)])
    plan = coordinator.begin(1)
    message = task(job, plan, 0, 1)
    sent.clear()
    checkpoint = coordinator.commit(plan, [message])
    epochs = f"/v1/jobs/{job.name}/epochs/{plan.epoch}"
    assert sent[0] == ("POST", f"{epochs}/commit")  # no prepare: the commit checks what it would
    assert not any(path.endswith("/prepare") for _method, path in sent)
    assert ("GET", f"/v1/jobs/{job.name}/checkpoints") not in sent  # the id came from begin's listing
    assert checkpoint.metadata == {"batch_id": 1, "epoch": plan.epoch}
    assert coordinator.latest().checkpoint_id == checkpoint.checkpoint_id
    assert [(p["committed_batch"], p["committed_epoch"]) for p in checkpoint.parts] == [(1, plan.epoch)]
    assert coordinator.applied() == Applied(1, plan.epoch)  # the replica's own record
    assert set(totals(job, KEYS).values()) == {2}


def test_one_replica_whose_commit_finds_writes_missing_applies_nothing(single):
    check_a_replica_without_the_staged_writes_fails_the_batch(*single)  # the one-phase commit's check


def test_one_replica_driver_dying_between_its_one_phase_commit_and_the_checkpoint(single):
    """The commit recorded the batch with its writes: the next driver's attempt of it is a replay,
    and the batch after it first checkpoints what the state holds (a point to undo a later half commit)."""
    job, coordinator = single
    coordinator.commit(first := coordinator.begin(0), [task(job, first, 0, 1)])
    plan = coordinator.begin(1)
    bodies = commit_bodies(winners([task(job, plan, 0, 100)]), 1, plan.batch_id)
    job.replicas[0].json("POST", f"/v1/jobs/{job.name}/epochs/{plan.epoch}/commit", bodies[0])  # ...dies here
    assert set(totals(job, KEYS).values()) == {101}
    restarted = MicroBatchCoordinator(job)
    assert restarted.begin(1).replay and set(totals(job, KEYS).values()) == {101}
    with pytest.raises(StaleEpoch):
        task(job, plan, 0, 100)  # a late attempt of the committed epoch applies nothing
    following = restarted.begin(2)
    assert restarted.latest().parts[0]["committed_epoch"] == plan.epoch  # checkpointed before batch 2 writes
    restarted.commit(following, [task(job, following, 0, 100)])
    assert set(totals(job, KEYS).values()) == {201}


def test_one_replica_driver_dying_after_sending_its_one_request_checkpoint(single):
    """The trigger that completes its part is the checkpoint: sent and the driver gone before the
    answer, the replica completes it anyway, and the next attempt of the batch is a replay."""
    job, coordinator = single
    coordinator.commit(first := coordinator.begin(0), [task(job, first, 0, 1)])
    plan = coordinator.begin(1)
    bodies = commit_bodies(winners([task(job, plan, 0, 100)]), 1, plan.batch_id)
    job.replicas[0].json("POST", f"/v1/jobs/{job.name}/epochs/{plan.epoch}/commit", bodies[0])
    metadata = {"batch_id": 1, "epoch": plan.epoch}
    job.replicas[0].json("POST", f"/v1/jobs/{job.name}/checkpoints", {"metadata": metadata, "complete": True})
    # ...and the driver dies before it reads the answer.
    assert MicroBatchCoordinator(job).begin(1).replay
    assert set(totals(job, KEYS).values()) == {101}
    follow = MicroBatchCoordinator(job)
    follow.commit(nxt := follow.begin(2), [task(job, nxt, 0, 1)])
    assert set(totals(job, KEYS).values()) == {102}
