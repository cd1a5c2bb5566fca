"""What a process's clients remember of a job (client/job.py ``KnownJob``): a later client, as a Spark
task in a reused Python worker opens, asks nothing before its first write; and whatever the replicas
now contradict (a state dropped and made again with another key type, the job dropped, or made again
with another max_parallelism) is read afresh, the refused request going again once, so no write is
wrong. Real RocksDB replicas: one, and two."""

import numpy as np
import pytest

from statehouse.client import NotFound, StatehouseClient
from statehouse.client.attempts import TaskAttempt
from statehouse.client.coordinator import MicroBatchCoordinator

pytestmark = [pytest.mark.http]

KEYS = [f"user-{i}" for i in range(40)]
ONES = np.ones(len(KEYS), dtype=np.int64)


def made(urls, job_name):
    """The job made on the replicas (two sums of string keys); their URLs."""
    with StatehouseClient(urls) as client:
        job = client.create_job(job_name, max_parallelism=128)
        job.register("total", "reducing", function="sum", value_type="int64")
        job.register("events", "reducing", function="sum", value_type="int64")
    return urls


@pytest.fixture
def one(server, job_name):
    """One replica with the job made there."""
    return made([server.url], job_name)


@pytest.fixture
def two(two_replicas, job_name):
    """Two replicas (RocksDB), which route by key group, with the job made there."""
    return made([s.url for s in two_replicas], job_name)


def task_job(client, name):
    """The job as a Spark task opens it: at the topology version its driver hands it (here: the one
    the process knows), so the process's layout and description of the job are taken as they are."""
    client.replicas.learn_cached()
    return client.job(name, version=client.replicas.version)


def read(urls, job_name, state, keys):
    """The committed values, by a client that remembers nothing (the process forgets the job first)."""
    from statehouse.client.job import forget_job

    with StatehouseClient(urls) as client:
        forget_job(client.replicas, job_name)
        return client.job(job_name).columns().get(state, keys).tolist()


def check_a_later_client_of_the_process_asks_nothing_before_its_writes(urls, job_name, sent):
    with StatehouseClient(urls) as first:
        task_job(first, job_name).columns().add_get_states({"total": ONES, "events": ONES}, KEYS)
    sent.clear()
    with StatehouseClient(urls) as later:  # a task in a reused worker: the layout and the job are known
        task_job(later, job_name).columns().add_get_states({"total": ONES, "events": ONES}, KEYS)
    assert {path for _method, path in sent} == {f"/v1/jobs/{job_name}/columns/add_get"}
    assert len(sent) == len(urls)  # one request per replica, nothing else
    assert read(urls, job_name, "events", KEYS) == [2] * len(KEYS)


def remake_state(urls, job_name, state, **descriptor):
    """Drop the state and register it again, as another process would (nothing this one remembers)."""
    with StatehouseClient(urls) as other:
        other.replicas.on_all("DELETE", f"/v1/jobs/{job_name}/states/{state}")
        other.replicas.on_all(
            "PUT", f"/v1/jobs/{job_name}/states/{state}", {"kind": "reducing", "function": "sum", **descriptor}
        )


def check_a_state_made_again_with_another_key_type_is_read_again_and_written_right(urls, job_name):
    with StatehouseClient(urls) as warm:
        task_job(warm, job_name).columns().add("total", KEYS, 1)  # the process knows: string keys
    remake_state(urls, job_name, "total", key_type="long", value_type="int64")
    ids = list(range(100, 140))
    with StatehouseClient(urls) as cached:
        job = task_job(cached, job_name)
        assert job.cached
        assert job.columns().add("total", ids, 5) == len(ids)  # refused here for its type, read again
        with job.batch() as batch:  # the row path: so is the key of one operation
            batch.add("total", 100, 1)
    assert read(urls, job_name, "total", ids) == [6] + [5] * (len(ids) - 1)
    remake_state(urls, job_name, "total", value_type="int64")  # and back to string keys
    with StatehouseClient(urls) as cached:
        task_job(cached, job_name).columns().add("total", KEYS, 2)
    assert read(urls, job_name, "total", KEYS) == [2] * len(KEYS)


def test_a_task_attempt_on_one_replica_goes_again_under_the_state_as_it_is_now(server, job_name):
    """Staged writes too: the refused request staged nothing, so it goes again with the same seq,
    and the micro-batch commits exactly once."""
    urls = [server.url]
    with StatehouseClient(urls) as setup:
        job = setup.create_job(job_name, max_parallelism=128)
        job.register("total", "reducing", function="sum", key_type="int", value_type="int64")
        job.columns().add("total", [1, 2], 1)  # the process knows: int keys
        coordinator = MicroBatchCoordinator(job)
        plan = coordinator.begin(0)
    remake_state(urls, job_name, "total", value_type="int64")  # string keys now
    with StatehouseClient(urls) as task:
        job = task_job(task, job_name)
        attempt = TaskAttempt(plan.epoch, 0, 1, unit="u", task=1)
        assert job.columns(attempt).add("total", KEYS, 3) == len(KEYS)
        with job.batch(attempt=attempt) as batch:
            batch.add("total", KEYS[0], 1)
        message = attempt.message()
    assert message.ops == (len(KEYS) + 1,)
    with StatehouseClient(urls) as driver:
        coordinator = MicroBatchCoordinator(driver.job(job_name))
        coordinator.commit(plan, [message])
    assert read(urls, job_name, "total", KEYS) == [4] + [3] * (len(KEYS) - 1)


def check_a_dropped_state_or_job_is_refused_as_such_and_forgotten(urls, job_name):
    with StatehouseClient(urls) as warm:
        task_job(warm, job_name).columns().add_get_states({"total": ONES, "events": ONES}, KEYS)
    with StatehouseClient(urls) as other:
        other.replicas.on_all("DELETE", f"/v1/jobs/{job_name}/states/events")
    with StatehouseClient(urls) as cached:
        with pytest.raises(NotFound, match="state_not_found"):
            task_job(cached, job_name).columns().add("events", KEYS, 1)
        assert task_job(cached, job_name).columns().add("total", KEYS, 1) == len(KEYS)
    with StatehouseClient(urls) as other:
        other.replicas.on_all("DELETE", f"/v1/jobs/{job_name}")
    with StatehouseClient(urls) as cached:
        with pytest.raises(NotFound, match="job_not_found"):
            task_job(cached, job_name).columns().add("total", KEYS, 1)
        with pytest.raises(NotFound, match="create_job"):  # forgotten: asked, and refused at once
            task_job(cached, job_name)


def test_a_job_made_again_with_another_max_parallelism_is_routed_by_it(two_replicas, job_name):
    """Two replicas route by key group: rows routed by the old max_parallelism are refused
    (421 key_not_owned, nothing applied) and go again to their owners under the new one."""
    urls = [s.url for s in two_replicas]
    with StatehouseClient(urls) as setup:
        job = setup.create_job(job_name, max_parallelism=128)
        job.register("total", "reducing", function="sum", value_type="int64")
        job.columns().add("total", KEYS, 1)
        job.replicas.on_all("DELETE", f"/v1/jobs/{job_name}")
    with StatehouseClient(urls) as other:
        from statehouse.client.job import forget_job

        forget_job(other.replicas, job_name)  # (the same process: as another one would, it makes it anew)
        remade = other.replicas.on_all("PUT", f"/v1/jobs/{job_name}", {"max_parallelism": 7})
        assert {info["max_parallelism"] for info in remade} == {7}
        other.replicas.on_all(
            "PUT", f"/v1/jobs/{job_name}/states/total", {"kind": "reducing", "function": "sum", "value_type": "int64"}
        )
    with StatehouseClient(urls) as setup:  # the process remembers max_parallelism 128 again
        from statehouse.client.job import remember_job

        setup.replicas.learn()
        remember_job(setup.replicas, job_name, 128).key_types["total"] = "string"
    with StatehouseClient(urls) as cached:
        job = task_job(cached, job_name)
        assert (job.cached, job.max_parallelism) == (True, 128)
        assert job.columns().add("total", KEYS, 2) == len(KEYS)
        assert job.max_parallelism == 7
    with StatehouseClient(urls) as setup:
        setup.replicas.learn()
        remember_job(setup.replicas, job_name, 128).key_types["total"] = "string"
    with StatehouseClient(urls) as cached, task_job(cached, job_name).batch() as batch:
        for key in KEYS:
            batch.add("total", key, 1)
    assert read(urls, job_name, "total", KEYS) == [3] * len(KEYS)


def test_a_later_client_of_the_process_asks_nothing_before_its_writes_on_one_replica(one, job_name, sent):
    check_a_later_client_of_the_process_asks_nothing_before_its_writes(one, job_name, sent)


def test_a_later_client_of_the_process_asks_nothing_before_its_writes_on_two_replicas(two, job_name, sent):
    check_a_later_client_of_the_process_asks_nothing_before_its_writes(two, job_name, sent)


def test_a_state_made_again_with_another_key_type_is_read_again_and_written_right_on_one_replica(one, job_name):
    check_a_state_made_again_with_another_key_type_is_read_again_and_written_right(one, job_name)


def test_a_state_made_again_with_another_key_type_is_read_again_and_written_right_on_two_replicas(two, job_name):
    check_a_state_made_again_with_another_key_type_is_read_again_and_written_right(two, job_name)


def test_a_dropped_state_or_job_is_refused_as_such_and_forgotten_on_one_replica(one, job_name):
    check_a_dropped_state_or_job_is_refused_as_such_and_forgotten(one, job_name)


def test_a_dropped_state_or_job_is_refused_as_such_and_forgotten_on_two_replicas(two, job_name):
    check_a_dropped_state_or_job_is_refused_as_such_and_forgotten(two, job_name)


def test_a_task_handed_a_newer_topology_version_learns_the_layout_first(two, job_name, sent):
    """A task's driver began the batch under a version the task's process has not seen (a live
    rescale since the worker's last task): the layout is learned afresh before the job is used,
    and what the process knew of the job is taken only for the layout it was read under."""
    with StatehouseClient(two) as first:
        version = task_job(first, job_name).replicas.version
    sent.clear()
    with StatehouseClient(two) as task:
        job = task.job(job_name, version=version + 1)
        assert ("GET", "/v1/topology") in sent and not task.replicas.cached
        job.columns().add("total", KEYS, 1)
    with StatehouseClient(two) as task:
        sent.clear()
        task.job(job_name, version=version).columns().add("total", KEYS, 1)
        assert [path for _method, path in sent] == [f"/v1/jobs/{job_name}/states/total/columns/add"] * 2
    assert read(two, job_name, "total", KEYS) == [2] * len(KEYS)
