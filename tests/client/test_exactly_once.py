"""The micro-batch protocol without Spark, step by step, against two real replicas: tasks are
simulated by ``TaskAttempt`` objects, their commit messages handed to the driver by hand."""

import pytest

from statehouse.client import StaleEpoch, StatehouseClient
from statehouse.client.attempts import CommitMessage, TaskAttempt, commit_bodies, merged, winners
from statehouse.client.coordinator import Applied, CheckpointCoordinator, MicroBatchCoordinator, StateBehind
from statehouse.client.spark import CommitMessages
from tests.support.micro_batches import KEYS, check_a_replica_without_the_staged_writes_fails_the_batch, task, totals

pytestmark = [pytest.mark.http]


@pytest.fixture
def setup(two_replicas, job_name):
    client = StatehouseClient([s.url for s in two_replicas])
    job = client.create_job(job_name, max_parallelism=128)
    job.register("total", "reducing", function="sum")
    yield job, MicroBatchCoordinator(job)
    client.close()


def test_batches_apply_once_at_the_commit_and_replays_do_not_write(setup):
    job, coordinator = setup
    plan = coordinator.begin(0)
    assert not plan.replay and plan.epoch is not None
    messages = [task(job, plan, 0, 1, KEYS[:10], 1), task(job, plan, 1, 1, KEYS[10:], 2)]
    assert set(totals(job, KEYS).values()) == {None}  # staged: invisible until the commit
    assert coordinator.commit(plan, messages).metadata == {"batch_id": 0, "epoch": plan.epoch}
    assert set(totals(job, KEYS).values()) == {1}
    replay = coordinator.begin(0)  # Spark lost its own commit of batch 0 and runs it again
    assert replay.replay and replay.epoch is None
    assert coordinator.commit(replay) is None
    assert set(totals(job, KEYS).values()) == {1}


def test_a_retried_task_and_a_speculative_copy_count_once(setup):
    job, coordinator = setup
    plan = coordinator.begin(0)
    task(job, plan, 0, 1, KEYS[:10], task_id=1)  # fails after its writes: Spark never reports it
    retry = task(job, plan, 0, 1, KEYS[:10], task_id=2)
    speculative = task(job, plan, 0, 1, KEYS[:10], task_id=3)  # both finish; Spark may report both
    other = task(job, plan, 1, 1, KEYS, task_id=4)  # another partition, overlapping keys
    coordinator.commit(plan, [speculative, other, retry])
    assert totals(job, KEYS) == {k: 2 if i < 10 else 1 for i, k in enumerate(KEYS)}


def test_a_task_reads_its_own_writes_and_nobody_else_does(setup):
    job, coordinator = setup
    plan = coordinator.begin(0)
    attempt = TaskAttempt(plan.epoch, 0, len(job.replicas), task=1)
    with job.batch(attempt=attempt) as batch:
        batch.add("total", "u", 5)
        mine = batch.get("total", "u")
    other = TaskAttempt(plan.epoch, 1, len(job.replicas), task=2)
    with job.batch(attempt=other) as batch:
        theirs = batch.get("total", "u")
    assert (mine.value, theirs.value, totals(job, ["u"])["u"]) == (5, None, None)


def test_a_driver_dying_mid_commit_is_undone_by_the_next_attempt(setup):
    job, coordinator = setup
    coordinator.commit(first := coordinator.begin(0), [task(job, first, 0, 1)])
    plan = coordinator.begin(1)
    bodies = commit_bodies(winners([task(job, plan, 0, 100)]), 2)
    path = f"/v1/jobs/{job.name}/epochs/{plan.epoch}"
    job.replicas.on_each("POST", f"{path}/prepare", bodies)
    job.replicas[0].json("POST", f"{path}/commit", bodies[0])  # ...and the driver dies here
    assert {1, 101} == set(totals(job, KEYS).values())
    retry = coordinator.begin(1)  # replica 0 committed an epoch no checkpoint records: restore
    assert retry.epoch > plan.epoch
    assert set(totals(job, KEYS).values()) == {1}
    with pytest.raises(StaleEpoch):  # a zombie task of the dead attempt cannot write
        task(job, plan, 0, 100)
    coordinator.commit(retry, [task(job, retry, 0, 100)])
    assert set(totals(job, KEYS).values()) == {101}


def test_a_replica_without_the_staged_writes_fails_the_batch_and_applies_nothing(setup):
    check_a_replica_without_the_staged_writes_fails_the_batch(*setup)


def test_a_gap_in_batch_ids_is_refused(setup):
    _job, coordinator = setup
    coordinator.commit(coordinator.begin(0))
    with pytest.raises(StateBehind):
        coordinator.begin(5)


def test_a_task_reporting_in_parts_commits_their_sum(setup):
    """``with_state_grouped``'s way: an attempt reports the writes of each group as it goes; the
    parts reach the driver interleaved with other attempts' (two helpers in one task) or added
    up already (the accumulator), and commit as one message per attempt."""
    job, coordinator = setup
    plan = coordinator.begin(0)
    grouped = TaskAttempt(plan.epoch, 0, len(job.replicas), unit="u", task=1)
    other = TaskAttempt(plan.epoch, 0, len(job.replicas), unit="v", task=1)
    parts = []
    for group in (KEYS[:7], KEYS[7:8], KEYS[8:]):
        with job.batch(attempt=grouped) as writes:
            for k in group:
                writes.add("total", k, 1)
        parts.append(grouped.unreported())
        with job.batch(attempt=other) as writes:
            writes.add("total", group[0], 10)
        parts.append(other.unreported())
    assert sum(sum(p.ops) for p in parts if p.attempt == grouped.attempt) == len(KEYS)
    assert grouped.unreported().ops == (0, 0)  # nothing new since the last part
    accumulated = CommitMessages().addInPlace([], [p.to_dict() for p in parts[:2]])
    accumulated = CommitMessages().addInPlace(accumulated, [p.to_dict() for p in parts[2:]])
    assert len(accumulated) == 6  # interleaved: nothing adjacent to add up
    assert merged(parts) == [grouped.message(), other.message()]
    coordinator.commit(plan, [CommitMessage.from_dict(m) for m in accumulated])
    assert totals(job, KEYS) == {k: 1 + (10 if k in ("user-0", "user-7", "user-8") else 0) for k in KEYS}


def test_the_accumulator_adds_up_the_parts_of_one_attempt():
    first = CommitMessage("u", 0, 1, "a", (2, 0)).to_dict()
    again = CommitMessage("u", 0, 1, "a", (1, 3)).to_dict()
    later = CommitMessage("u", 1, 2, "b", (0, 1)).to_dict()
    value = CommitMessages().addInPlace([], [first])
    value = CommitMessages().addInPlace(value, [again, later])
    assert value == [{**first, "ops": [3, 3]}, later]
    assert first["ops"] == [2, 0]  # the parts themselves are left as they were


# -- the round trips a micro-batch folds -----------------------------------------------------


def test_a_listed_checkpoint_id_taken_meanwhile_is_listed_again(setup):
    """Two replicas take the id begin's listing gave; one another checkpoint took since is refused
    whole, aborted only where this one was triggered, and the checkpoint goes again under a new id."""
    job, coordinator = setup
    coordinator.commit(first := coordinator.begin(0), [task(job, first, 0, 1)])
    plan = coordinator.begin(1)
    message = task(job, plan, 0, 1)
    other = MicroBatchCoordinator(job).savepoint(metadata={"by": "someone else"})  # an operator's savepoint
    checkpoint = coordinator.commit(plan, [message])
    assert checkpoint.checkpoint_id > other.checkpoint_id
    assert checkpoint.metadata == {"batch_id": 1, "epoch": plan.epoch}
    assert coordinator.applied() == Applied(1, plan.epoch)
    kept = [c for c in coordinator.completed() if c.checkpoint_id == other.checkpoint_id]
    assert [c.metadata for c in kept] == [{"by": "someone else"}]
    assert set(totals(job, KEYS).values()) == {2}


def test_a_coordinator_whose_listings_keep_losing_the_race_gets_ahead(setup, monkeypatch):
    """Another coordinator takes three checkpoints each time this one lists (a query's beside a
    move's whose replicas are busy uploading): each listed id is taken before the trigger, so this
    one lists again, each time skipping further ahead, and gets its checkpoint; the other's next
    checkpoint goes on above it."""
    job, _coordinator = setup
    query, move = CheckpointCoordinator(job), CheckpointCoordinator(job)
    listed = CheckpointCoordinator.next_id
    taken: list[int] = []

    def listing_then_the_query_checkpoints(self: CheckpointCoordinator) -> int:
        next_id = listed(self)
        if self is move and len(taken) < 30:
            taken.extend(query.checkpoint(metadata={"by": "query"}).checkpoint_id for _ in range(3))
        return next_id

    monkeypatch.setattr(CheckpointCoordinator, "next_id", listing_then_the_query_checkpoints)
    checkpoint = move.checkpoint(metadata={"rescale_version": 2})
    assert len(taken) in (6, 9) and checkpoint.checkpoint_id > max(taken), (checkpoint.checkpoint_id, taken)
    assert query.checkpoint(metadata={"by": "query"}).checkpoint_id > checkpoint.checkpoint_id


def test_parts_still_uploading_when_the_trigger_answers_are_waited_for(setup, monkeypatch):
    """A trigger's wait that ends before the upload does (here: no wait at all) leaves the part
    `in_progress`: the coordinator waits for it as before, and completes every part only then."""
    from statehouse.client import global_checkpoints

    job, coordinator = setup
    monkeypatch.setattr(global_checkpoints, "_LONG_POLL_MS", 0)
    coordinator.commit(first := coordinator.begin(0), [task(job, first, 0, 1)])
    checkpoint = coordinator.commit(plan := coordinator.begin(1), [task(job, plan, 0, 1)])
    assert [part["status"] for part in checkpoint.parts] == ["completed", "completed"]
    assert coordinator.latest().checkpoint_id == checkpoint.checkpoint_id
    assert set(totals(job, KEYS).values()) == {2}
