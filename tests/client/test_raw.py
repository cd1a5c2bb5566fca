"""Raw state through the client (``client/raw.py``) against two real replicas: each key group's
stream on its owner, a 421 from the other, operator partitions by subtask."""

import httpx
import pytest

from statehouse.client import InvalidRequest, StaleEpoch, StatehouseClient
from statehouse.client.attempts import TaskAttempt
from statehouse.client.coordinator import MicroBatchCoordinator
from statehouse.client.raw import RawKeyedState, RawOperatorState
from statehouse.protocol.keygroups import KeyGroupRange

pytestmark = [pytest.mark.http]


@pytest.fixture
def job(two_replicas, job_name):
    with StatehouseClient([s.url for s in two_replicas]) as client:
        yield client.create_job(job_name, max_parallelism=32)


def test_streams_route_to_their_owners(job, two_replicas):
    raw = RawKeyedState(job)
    streams = {kg: bytes([kg, 0, 255]) * (kg + 1) for kg in range(32)}
    for kg, data in streams.items():
        raw.update(kg, data[:2])
        assert raw.append(kg, data[2:]) == len(data)
    assert {kg: raw.get(kg) for kg in range(32)} == streams
    for index, server in enumerate(two_replicas):
        owned = KeyGroupRange.for_operator(32, 2, index)
        with httpx.Client(base_url=f"{server.url}/v1/jobs/{job.name}/raw/key-groups") as direct:
            answers = {kg: direct.get(f"/{kg}") for kg in range(32)}
        for kg, r in answers.items():
            if kg in owned:
                assert r.content == streams[kg]
            else:  # the keyed routes' owner check: 421 naming the owner
                assert r.status_code == 421 and r.json()["code"] == "key_not_owned" and r.json()["owner"] == 1 - index
    raw.clear(5)
    assert raw.get(5) == b""
    with pytest.raises(InvalidRequest):
        raw.get(32)


def test_operator_partitions_route_by_subtask(job, two_replicas):
    raw = RawOperatorState(job)
    for subtask in range(3):
        raw.update("source", subtask, [f"{subtask}-{p}".encode() for p in range(subtask + 1)])
    assert [raw.get("source", s) for s in range(3)] == [[b"0-0"], [b"1-0", b"1-1"], [b"2-0", b"2-1", b"2-2"]]
    path = f"/v1/jobs/{job.name}/operators/source/subtasks/1/raw"
    assert httpx.get(two_replicas[1].url + path).json() == {"partitions": ["MS0w", "MS0x"]}
    assert httpx.get(two_replicas[0].url + path).status_code == 404
    raw.clear("source", 2)
    assert raw.get("source", 2) == []


def test_writes_fenced_by_an_epoch(job):
    """With an epoch, writes name it: once the job is fenced past it they are refused, unapplied."""
    job.fence(4)
    writer, zombie = RawKeyedState(job, epoch=4), RawKeyedState(job, epoch=3)
    writer.update(1, b"current")
    with pytest.raises(StaleEpoch):
        zombie.update(1, b"stale")
    with pytest.raises(StaleEpoch):
        RawOperatorState(job, epoch=3).update("source", 0, [b"stale"])
    assert writer.get(1) == b"current" and RawOperatorState(job).get("source", 0) == []


def test_the_jobs_shortcuts(job):
    job.raw_keyed().update(3, b"via the job")
    assert RawKeyedState(job).get(3) == b"via the job"
    job.raw_operator().update("source", 1, [b"a"])
    assert job.raw_operator().get("source", 1) == [b"a"]


def test_batches_route_raw_operations_by_key_group_and_subtask(job, two_replicas):
    """A batch's raw operations go to the key group's owner (or the subtask's replica), each
    replica's part atomic; what they wrote is what the single calls read."""
    streams = {kg: bytes([kg, 0, 255]) * (kg + 1) for kg in range(32)}
    with job.batch() as batch:
        for kg, data in streams.items():
            batch.raw_put(kg, data[:2])
            batch.raw_append(kg, data[2:])
        for subtask in range(3):
            batch.raw_operator_put("source", subtask, [f"{subtask}-{p}".encode() for p in range(subtask + 1)])
    raw = job.raw_keyed()
    assert {kg: raw.get(kg) for kg in range(32)} == streams
    assert [job.raw_operator().get("source", s) for s in range(3)] == [
        [b"0-0"],
        [b"1-0", b"1-1"],
        [b"2-0", b"2-1", b"2-2"],
    ]
    with job.batch() as batch:
        reads = {kg: batch.raw_get(kg) for kg in (0, 31)}
        parts = batch.raw_operator_get("source", 1)
        none = batch.raw_operator_get("source", 7)
        batch.raw_delete(5)
    assert {kg: r.value for kg, r in reads.items()} == {0: streams[0], 31: streams[31]}
    assert parts.value == [b"1-0", b"1-1"] and none.value == []
    assert raw.get(5) == b""
    with pytest.raises(InvalidRequest):
        job.batch().raw_get(32)  # refused before anything is sent


def test_a_task_attempts_raw_writes_are_staged_and_committed_once(job):
    """Raw writes staged under a Spark task attempt: invisible until the driver commits the
    winner, then applied once (the loser's append and a re-run's are dropped)."""
    job.raw_keyed().update(9, b"base|")
    coordinator = MicroBatchCoordinator(job)
    plan = coordinator.begin(0)
    winner = TaskAttempt(plan.epoch, 0, len(job.replicas), unit="u", task=1)
    loser = TaskAttempt(plan.epoch, 0, len(job.replicas), unit="u", task=2)
    for attempt in (winner, loser):
        with job.batch(attempt=attempt) as batch:
            batch.raw_append(9, b"once")
            batch.raw_operator_put("source", 4, [b"staged"])
            mine = batch.raw_get(9)
        assert mine.value == b"base|once"  # read-your-writes
    assert job.raw_keyed().get(9) == b"base|" and job.raw_operator().get("source", 4) == []
    coordinator.commit(plan, [winner.message()])
    assert job.raw_keyed().get(9) == b"base|once"
    assert job.raw_operator().get("source", 4) == [b"staged"]
