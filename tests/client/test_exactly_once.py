"""The micro-batch protocol without Spark, step by step, against two real replicas."""

import pytest

from statehouse.client import StaleEpoch, StatehouseClient
from statehouse.client.coordinator import MicroBatchCoordinator, StateBehind


@pytest.fixture
def setup(two_replicas, job_name):
    client = StatehouseClient([s.url for s in two_replicas])
    job = client.create_job(job_name, max_parallelism=128)
    job.register("total", "reducing", function="sum")
    yield job, MicroBatchCoordinator(job)
    client.close()


def totals(job, keys):
    with job.batch() as reads:
        pending = {k: reads.get("total", k) for k in keys}
    return {k: p.value for k, p in pending.items()}


KEYS = [f"user-{i}" for i in range(20)]


def apply(job, plan, amount):
    with job.batch(epoch=plan.epoch) as writes:
        for k in KEYS:
            writes.add("total", k, amount)


def test_batches_apply_once_and_replays_do_not_write(setup):
    job, coordinator = setup
    plan = coordinator.begin(0)
    assert not plan.replay and plan.epoch is not None
    apply(job, plan, 1)
    assert coordinator.commit(plan).metadata == {"batch_id": 0, "epoch": plan.epoch}
    replay = coordinator.begin(0)  # Spark lost its own commit of batch 0 and runs it again
    assert replay.replay and replay.epoch is None
    assert coordinator.commit(replay) is None
    assert set(totals(job, KEYS).values()) == {1}


def test_a_failed_attempt_is_rolled_back_and_its_zombie_fenced(setup):
    job, coordinator = setup
    first = coordinator.begin(0)
    apply(job, first, 1)
    coordinator.commit(first)
    attempt = coordinator.begin(1)
    with job.batch(epoch=attempt.epoch) as writes:  # half of batch 1, then the attempt dies
        for k in KEYS[:10]:
            writes.add("total", k, 100)
    retry = coordinator.begin(1)
    assert retry.epoch > attempt.epoch
    assert set(totals(job, KEYS).values()) == {1}  # the partial attempt was undone
    # a zombie task of the dead attempt cannot write
    with pytest.raises(StaleEpoch), job.batch(epoch=attempt.epoch) as writes:
        writes.add("total", KEYS[0], 100)
    apply(job, retry, 100)
    coordinator.commit(retry)
    assert set(totals(job, KEYS).values()) == {101}


def test_a_gap_in_batch_ids_is_refused(setup):
    _job, coordinator = setup
    coordinator.commit(coordinator.begin(0))
    with pytest.raises(StateBehind):
        coordinator.begin(5)
