"""The user-features Structured Streaming job on real local Spark against real replicas:
end to end, a batch that fails midway, and a rescale from 2 to 3 replicas."""

import json
import os

import pytest

from statehouse.client import StatehouseClient
from statehouse.client.coordinator import MicroBatchCoordinator
from tests.support.features_pipeline import assert_matches, make_events, reference, run, state_of, write_files
from tests.support.server import start_replica_set

pytestmark = [pytest.mark.http, pytest.mark.spark]


def test_pipeline_end_to_end(spark, tmp_path, two_replicas, job_name):
    urls = [s.url for s in two_replicas]
    batches = make_events(1, files=3, per_file=80)
    write_files(tmp_path / "input", batches)
    query = run(spark, tmp_path, urls, job_name)
    assert query.exception() is None
    expected = reference(batches)
    assert_matches(state_of(urls, job_name, expected), expected)
    # every micro-batch wrote its features, and the last write of each user is its final state
    outputs = sorted((tmp_path / "output").glob("batch_id=*"))
    assert [p.name for p in outputs] == ["batch_id=0", "batch_id=1", "batch_id=2"]
    latest = {}
    for path in outputs:
        for part in path.glob("*.json"):
            for line in part.read_text().splitlines():
                row = json.loads(line)
                latest[row["user_id"]] = row
    for user, row in latest.items():
        assert row["total_spent"] == pytest.approx(expected[user]["total_spent"])
    # one global checkpoint per batch, plus the baseline, each recording its batch
    with StatehouseClient(urls) as client:
        batches_done = [c.metadata["batch_id"] for c in MicroBatchCoordinator(client.job(job_name)).completed()]
    assert batches_done[-3:] == [0, 1, 2]


def test_a_batch_failing_midway_is_not_double_counted(spark, tmp_path, two_replicas, job_name):
    urls = [s.url for s in two_replicas]
    batches = make_events(2, files=3, per_file=80)
    write_files(tmp_path / "input", batches)
    marker = str(tmp_path / "failed-once")

    def fail_twice_in_batch_1(ctx):
        # After a partition of batch 1 has written its updates: fail the attempt, and its
        # retry (spark.task.maxFailures is 2 here), so the whole batch fails.
        if ctx.batch_id == 1 and ctx.attempt.partition == 0:
            with open(marker, "a") as f:
                f.write("x")
            if os.path.getsize(marker) <= 2:
                raise RuntimeError("injected failure midway through batch 1")

    failed = run(spark, tmp_path, urls, job_name, on_partition=fail_twice_in_batch_1)
    assert failed.exception() is not None and os.path.exists(marker)
    restarted = run(spark, tmp_path, urls, job_name)  # same Spark checkpoint: batch 1 is re-run
    assert restarted.exception() is None
    expected = reference(batches)
    assert_matches(state_of(urls, job_name, expected), expected)


def test_rescale_from_two_to_three_replicas(spark, tmp_path, two_replicas, job_name, tmp_path_factory):
    old_urls = [s.url for s in two_replicas]
    batches = make_events(3, files=4, per_file=60)
    write_files(tmp_path / "input", batches[:2])
    assert run(spark, tmp_path, old_urls, job_name).exception() is None
    with StatehouseClient(old_urls) as client:
        coordinator = MicroBatchCoordinator(client.job(job_name))
        savepoint = coordinator.savepoint()  # records the micro-batch the state holds, whoever takes it
    # A new deployment of three replicas on fresh disks, reading the same checkpoint storage.
    storage = two_replicas[0].settings["STATEHOUSE_CHECKPOINT_DIR"]
    workdirs = [tmp_path_factory.mktemp(f"rescaled-{i}") for i in range(3)]
    new = start_replica_set(workdirs, {"STATEHOUSE_CHECKPOINT_DIR": storage})
    try:
        new_urls = [s.url for s in new]
        with StatehouseClient(new_urls) as client:
            coordinator = MicroBatchCoordinator(client.create_job(job_name, 128))  # fresh disks: no job yet
            restored = coordinator.restore(savepoint.checkpoint_id)
            assert [r["key_group_range"] for r in restored] == [[0, 42], [43, 85], [86, 127]]
            assert coordinator.applied().batch_id == 1  # the batch restored with the state
        expected_so_far = reference(batches[:2])
        assert_matches(state_of(new_urls, job_name, expected_so_far), expected_so_far)
        write_files(tmp_path / "input", batches[2:], start=2)
        assert run(spark, tmp_path, new_urls, job_name).exception() is None
        expected = reference(batches)
        assert_matches(state_of(new_urls, job_name, expected), expected)
    finally:
        for server in new:
            server.stop()
