"""Spark's own failure modes against exactly-once per task attempt, on real local Spark
(``local[2,2]``: failed tasks are retried) and real replicas; every user's state is compared
with an oracle computed in plain Python over the same input: no update lost, none doubled."""

import contextlib
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from docs.examples import user_features
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.coordinator import MicroBatchCoordinator
from statehouse.client.spark import exactly_once, with_state
from tests.spark.test_spark_pipeline import (
    assert_matches,
    event_stream,
    make_events,
    reference,
    run,
    start_query,
    state_of,
    write_files,
)
from tests.support.server import start_server

pytestmark = [pytest.mark.http, pytest.mark.spark]

FEATURES_SCHEMA = (
    "user_id STRING, batch_id LONG, total_spent DOUBLE, avg_amount DOUBLE, "
    "recent_items ARRAY<STRING>, item_counts MAP<STRING, LONG>"
)


def marker_once(path):
    """True the first time only (across Spark's Python worker processes)."""
    try:
        with open(path, "x"):
            return True
    except FileExistsError:
        return False


def check_against_oracle(urls, job, batches):
    expected = reference(batches)
    assert_matches(state_of(urls, job, expected), expected)
    with StatehouseClient(list(urls)) as client:
        done = [c.metadata["batch_id"] for c in MicroBatchCoordinator(client.job(job)).completed()]
    assert done[-len(batches) :] == list(range(len(batches)))


def test_a_task_failing_after_its_writes_is_retried_and_counted_once(spark, tmp_path, two_replicas, job_name):
    urls = [s.url for s in two_replicas]
    batches = make_events(11, files=3, per_file=80)
    write_files(tmp_path / "input", batches)
    marker = str(tmp_path / "failed")

    def fail_first_attempt(ctx):
        # Every write and read of the partition is done; the task dies before it ends.
        if ctx.batch_id == 1 and ctx.attempt.partition == 0 and marker_once(marker):
            raise RuntimeError("injected task failure after its writes")

    query = run(spark, tmp_path, urls, job_name, on_partition=fail_first_attempt)
    assert query.exception() is None and os.path.exists(marker)  # Spark retried the task
    check_against_oracle(urls, job_name, batches)


def test_duplicate_attempts_of_every_partition_count_once(spark, tmp_path, two_replicas, job_name):
    """Spark never runs a speculative copy on the host of the original, so one machine cannot
    speculate; a second job over the same partitions, at the same time, makes what speculation
    makes: two concurrent attempts of each partition, both successful, both reported."""
    urls = [s.url for s in two_replicas]
    config = ClientConfig.of(urls)
    user_features.setup(config, job_name)
    batches = make_events(12, files=2, per_file=80)
    write_files(tmp_path / "input", batches)
    output = tmp_path / "output"

    def process(df, ctx):
        from pyspark.sql import functions as F

        grouped = df.groupBy("user_id").agg(F.collect_list(F.struct("item", "amount")).alias("events"))
        features = grouped.rdd.mapPartitions(with_state(ctx, user_features.update_users))
        with ThreadPoolExecutor(1) as pool:
            duplicate = pool.submit(features.count)
            out = df.sparkSession.createDataFrame(features, FEATURES_SCHEMA)
            out.write.mode("overwrite").json(str(output / f"batch_id={ctx.batch_id}"))
            assert duplicate.result() > 0
        assert len({m.task for m in ctx.collected()}) > len({(m.unit, m.partition) for m in ctx.collected()})

    query = event_stream(spark, tmp_path, exactly_once(config, job_name, process))
    query.awaitTermination(240)
    assert query.exception() is None
    check_against_oracle(urls, job_name, batches)


def restart_in_place(server, tmp_path_factory):
    server.stop(signal.SIGKILL)
    workdir = tmp_path_factory.getbasetemp() / "restarted"
    port = int(server.url.rsplit(":", 1)[1])
    # The same data directory (RocksDB survives the kill), the same checkpoint storage and port.
    return start_server(workdir, server.settings, port=port)


def kill_a_replica_mid_batch(start, replicas, tmp_path, tmp_path_factory, job, batches, restore, caplog):
    """Run a query (``start(config, on_partition)`` starts it) over ``batches`` while replica 1 of
    ``replicas`` is killed (SIGKILL) and restarted in place after a task's writes of batch 1
    (``restore``: then restored from the latest global checkpoint, as if its disk were lost);
    the batch must fail loudly, re-run, and every user's state equal the oracle's."""
    urls = [s.url for s in replicas]
    write_files(tmp_path / "input", batches)
    reached, go = tmp_path / "reached", tmp_path / "go"

    def hold_first_attempt(ctx):
        # Batch 1, after a task's writes: wait while the test kills and restarts replica 1.
        if ctx.batch_id == 1 and marker_once(str(reached)):
            deadline = time.monotonic() + 120
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.1)

    config = ClientConfig.of(urls, retries=10, backoff=0.1)  # tasks ride out the restart (~3 s)
    query = start(config, hold_first_attempt)
    try:
        deadline = time.monotonic() + 120
        while not reached.exists():
            assert time.monotonic() < deadline and query.isActive, query.exception()
            time.sleep(0.1)
        replicas[1] = restart_in_place(replicas[1], tmp_path_factory)
        if restore:  # the replica lost its disk: restore it from the latest global checkpoint
            with StatehouseClient(urls) as client:
                latest = MicroBatchCoordinator(client.job(job)).latest()
                assert latest is not None and latest.metadata["batch_id"] == 0
            httpx.post(
                f"{urls[1]}/v1/jobs/{job}/restore", json={"checkpoint_id": latest.checkpoint_id}, timeout=60
            ).raise_for_status()
        go.touch()
        with caplog.at_level("WARNING", logger="statehouse.client.spark"):
            query.awaitTermination(240)
    finally:
        go.touch()
        with contextlib.suppress(Exception):
            query.stop()
    assert query.exception() is None
    assert any("is re-run" in r.getMessage() for r in caplog.records)  # loudly, and re-run
    check_against_oracle(urls, job, batches)


@pytest.mark.parametrize("restore", [False, True], ids=["restart", "restart-and-restore"])
def test_a_replica_killed_mid_batch_fails_the_batch_loudly_and_it_is_rerun(
    spark, tmp_path, tmp_path_factory, own_replicas, job_name, restore, caplog
):
    def start(config, on_partition):
        return start_query(spark, tmp_path, config, job_name, on_partition=on_partition)

    batches = make_events(13 + restore, files=3, per_file=80)
    kill_a_replica_mid_batch(start, own_replicas, tmp_path, tmp_path_factory, job_name, batches, restore, caplog)
