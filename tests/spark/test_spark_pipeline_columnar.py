"""The columnar user-features job (mapInPandas, one columnar request per state and Arrow batch)
on real local Spark against real replicas: its sink output and final state equal the row-wise
job's on the same input, and the plain-Python oracle's, also under Spark's failure modes: a
task failing after its writes and retried, two concurrent attempts of every partition (what
speculation makes), a replica killed mid-batch. (The driver killed at each step is
``test_spark_driver_kill.py``'s, on the protocol both jobs share.)"""

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from docs.examples import user_features_columnar
from statehouse.client import ClientConfig
from statehouse.client.spark import exactly_once
from tests.support.features_pipeline import (
    assert_matches,
    check_against_oracle,
    event_stream,
    kill_a_replica_mid_batch,
    make_events,
    marker_once,
    reference,
    run,
    start_query,
    state_of,
    write_files,
)

pytestmark = [pytest.mark.http, pytest.mark.spark]


def sink(output):
    """Each micro-batch's rows, per user (the list of items sorted: its order is Spark's)."""
    batches = {}
    for directory in sorted(output.glob("batch_id=*")):
        rows = {}
        for part in directory.glob("*.json"):
            for line in part.read_text().splitlines():
                row = json.loads(line)
                assert row["user_id"] not in rows, f"{row['user_id']} twice in {directory.name}"
                rows[row["user_id"]] = {**row, "recent_items": sorted(row.get("recent_items", []))}
        batches[directory.name] = rows
    return batches


def assert_same_rows(actual, expected):
    assert list(actual) == list(expected)
    for name, rows in expected.items():
        assert set(actual[name]) == set(rows), name
        for user, row in rows.items():
            got = actual[name][user]
            assert got["batch_id"] == row["batch_id"]
            assert got["total_spent"] == pytest.approx(row["total_spent"]), (name, user)
            assert got["avg_amount"] == pytest.approx(row["avg_amount"]), (name, user)
            assert got["recent_items"] == row["recent_items"], (name, user)
            assert got["item_counts"] == row["item_counts"], (name, user)


def oracle_sink(batches):
    """What each micro-batch must write: its users' features after it, from the oracle."""
    expected = {}
    for b, events in enumerate(batches):
        state = reference(batches[: b + 1])
        users = {e["user_id"] for e in events}
        expected[f"batch_id={b}"] = {u: {**state[u], "user_id": u, "batch_id": b} for u in users}
    return expected


def test_columnar_job_equals_the_row_wise_job_and_the_oracle(spark, tmp_path, two_replicas, job_name):
    urls = [s.url for s in two_replicas]
    batches = make_events(21, files=3, per_file=120, users=20)  # ~6 events per user and batch
    assert all(len({e["user_id"] for e in events}) < len(events) for events in batches)
    write_files(tmp_path / "input", batches)
    rows_job, columnar_job = f"{job_name}-rows", f"{job_name}-columnar"

    assert run(spark, tmp_path, urls, rows_job).exception() is None
    # Arrow batches of 16 rows: a user's events span batches, yet the user gets one row.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "16")
    try:
        assert run(spark, tmp_path, urls, columnar_job, path="columnar").exception() is None
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    expected = reference(batches)
    columnar_state = state_of(urls, columnar_job, expected)
    assert_matches(columnar_state, expected)
    assert_matches(columnar_state, state_of(urls, rows_job, expected))
    columnar_sink = sink(tmp_path / "columnar-output")
    assert list(columnar_sink) == ["batch_id=0", "batch_id=1", "batch_id=2"]
    assert_same_rows(columnar_sink, sink(tmp_path / "output"))
    assert_same_rows(columnar_sink, oracle_sink(batches))


def test_a_columnar_task_failing_after_its_writes_is_retried_and_counted_once(spark, tmp_path, two_replicas, job_name):
    urls = [s.url for s in two_replicas]
    batches = make_events(22, files=3, per_file=120, users=20)
    write_files(tmp_path / "input", batches)
    marker = str(tmp_path / "failed")

    def fail_first_attempt(ctx):
        # Every columnar write and read of the partition is done; the task dies before it ends.
        if ctx.batch_id == 1 and ctx.attempt.partition == 0 and marker_once(marker):
            raise RuntimeError("injected task failure after its columnar writes")

    query = run(spark, tmp_path, urls, job_name, path="columnar", on_partition=fail_first_attempt)
    assert query.exception() is None and os.path.exists(marker)  # Spark retried the task
    check_against_oracle(urls, job_name, batches)
    assert_same_rows(sink(tmp_path / "columnar-output"), oracle_sink(batches))


def test_duplicate_columnar_attempts_of_every_partition_count_once(spark, tmp_path, two_replicas, job_name):
    """What speculation makes (see the row-wise test of the same name): the micro-batch's
    mapInPandas run twice at once, both attempts of every partition staging columnar writes,
    both successful and reported; the commit applies one per partition."""
    urls = [s.url for s in two_replicas]
    config = ClientConfig.of(urls)
    user_features_columnar.setup(config, job_name)
    batches = make_events(23, files=2, per_file=120, users=20)
    write_files(tmp_path / "input", batches)
    output = tmp_path / "columnar-output"

    def process(df, ctx):
        features = df.repartition("user_id").mapInPandas(
            user_features_columnar.features_of(ctx), user_features_columnar.FEATURES_SCHEMA
        )
        with ThreadPoolExecutor(1) as pool:
            duplicate = pool.submit(features.count)
            features.write.mode("overwrite").json(str(output / f"batch_id={ctx.batch_id}"))
            assert duplicate.result() > 0
        assert len({m.task for m in ctx.collected()}) > len({(m.unit, m.partition) for m in ctx.collected()})

    query = event_stream(spark, tmp_path, exactly_once(config, job_name, process))
    query.awaitTermination(240)
    assert query.exception() is None
    check_against_oracle(urls, job_name, batches)
    # Each attempt read its own staged writes: the sink, whichever attempt wrote it, is right.
    assert_same_rows(sink(output), oracle_sink(batches))


@pytest.mark.parametrize("restore", [False, True], ids=["restart", "restart-and-restore"])
def test_a_replica_killed_mid_columnar_batch_fails_the_batch_loudly_and_it_is_rerun(
    spark, tmp_path, tmp_path_factory, own_replicas, job_name, restore, caplog
):
    def start(config, on_partition):
        return start_query(spark, tmp_path, config, job_name, path="columnar", on_partition=on_partition)

    batches = make_events(24 + restore, files=3, per_file=120, users=20)
    kill_a_replica_mid_batch(start, own_replicas, tmp_path, tmp_path_factory, job_name, batches, restore, caplog)
    assert_same_rows(sink(tmp_path / "columnar-output"), oracle_sink(batches))
