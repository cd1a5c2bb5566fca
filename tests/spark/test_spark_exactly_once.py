"""Spark's own failure modes against exactly-once per task attempt, on real local Spark
(``local[2,2]``: failed tasks are retried) and real replicas; every user's state is compared
with an oracle computed in plain Python over the same input: no update lost, none doubled."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from docs.examples import user_features
from statehouse.client import ClientConfig
from statehouse.client.spark import exactly_once, with_state
from tests.support.features_pipeline import (
    check_against_oracle,
    event_stream,
    kill_a_replica_mid_batch,
    make_events,
    marker_once,
    run,
    start_query,
    write_files,
)

pytestmark = [pytest.mark.http, pytest.mark.spark]

FEATURES_SCHEMA = (
    "user_id STRING, batch_id LONG, total_spent DOUBLE, avg_amount DOUBLE, "
    "recent_items ARRAY<STRING>, item_counts MAP<STRING, LONG>"
)


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


@pytest.mark.parametrize("restore", [False, True], ids=["restart", "restart-and-restore"])
def test_a_replica_killed_mid_batch_fails_the_batch_loudly_and_it_is_rerun(
    spark, tmp_path, tmp_path_factory, own_replicas, job_name, restore, caplog
):
    def start(config, on_partition):
        return start_query(spark, tmp_path, config, job_name, on_partition=on_partition)

    batches = make_events(13 + restore, files=3, per_file=80)
    kill_a_replica_mid_batch(start, own_replicas, tmp_path, tmp_path_factory, job_name, batches, restore, caplog)
