"""``applyInPandas`` through :func:`with_state_grouped` (a function per group), exactly once per
task attempt, on real local Spark (``local[2,2]``: a failed task is retried) and real replicas:
every user's state and every output row are compared with an oracle in plain Python."""

import json
from collections import defaultdict

import pandas as pd
import pyarrow as pa
import pytest

from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.spark import exactly_once, with_state_grouped
from tests.support.features_pipeline import event_stream, make_events, marker_once, write_files

pytestmark = [pytest.mark.http, pytest.mark.spark]

OUTPUT_SCHEMA = "user_id STRING, batch_id LONG, spent DOUBLE, events LONG"


def setup(config, job):
    with StatehouseClient(config) as client:
        created = client.create_job(job, 128)
        created.register("spent", "reducing", function="sum", value_type="float64")
        created.register("events", "reducing", function="sum", value_type="int64")


def update_group(on_group):
    """One user's events of the micro-batch: two columnar writes, then the user's totals read
    back (the attempt's own writes included)."""

    def step(group, columns, ctx):
        users = group["user_id"]
        if not ctx.replay:
            columns.add("spent", users, group["amount"])
            columns.add("events", users, 1)
        user = users.iloc[:1]
        totals = pd.DataFrame(
            {
                "user_id": user.to_numpy(),
                "batch_id": ctx.batch_id,
                "spent": columns.get("spent", user).to_numpy(dtype="float64"),
                "events": columns.get("events", user).to_numpy(dtype="int64"),
            }
        )
        on_group(ctx)
        return totals

    return step


def update_group_arrow(group, columns, ctx):
    """:func:`update_group` for ``applyInArrow``: the group a ``pyarrow.Table``."""
    users = group.column("user_id")
    if not ctx.replay:
        columns.add("spent", users, group.column("amount"))
        columns.add("events", users, 1)
    user = users.slice(0, 1)
    return pa.table(
        {
            "user_id": user.cast(pa.string()),
            "batch_id": pa.array([ctx.batch_id], pa.int64()),
            "spent": columns.get("spent", user, as_arrow=True),
            "events": columns.get("events", user, as_arrow=True),
        }
    )


def run_grouped(spark, tmp_path, urls, job, on_group=lambda ctx: None, arrow=False):
    """The grouped query over ``tmp_path/input`` (``applyInPandas``, or ``applyInArrow``);
    returns the query and each micro-batch's commit messages (as the driver collected them)."""
    config = ClientConfig.of(urls)
    setup(config, job)
    messages = {}

    def process(df, ctx):
        grouped = df.groupBy("user_id")
        if arrow:
            out = grouped.applyInArrow(with_state_grouped(ctx, update_group_arrow), OUTPUT_SCHEMA)
        else:
            out = grouped.applyInPandas(with_state_grouped(ctx, update_group(on_group)), OUTPUT_SCHEMA)
        out.write.mode("overwrite").json(str(tmp_path / "output" / f"batch_id={ctx.batch_id}"))
        messages[ctx.batch_id] = ctx.collected()

    query = event_stream(spark, tmp_path, exactly_once(config, job, process))
    query.awaitTermination(240)
    return query, messages


def oracle(batches):
    """Per micro-batch, each user of it with its totals after that batch; and the final totals."""
    spent, events = defaultdict(float), defaultdict(int)
    rows = {}
    for batch_id, batch in enumerate(batches):
        for e in batch:
            spent[e["user_id"]] += e["amount"]
            events[e["user_id"]] += 1
        rows[batch_id] = {u: (batch_id, spent[u], events[u]) for u in {e["user_id"] for e in batch}}
    return rows, dict(spent), dict(events)


def check(tmp_path, urls, job, batches):
    rows, spent, events = oracle(batches)
    for batch_id, expected in rows.items():
        written = {}
        for part in (tmp_path / "output" / f"batch_id={batch_id}").glob("part-*.json"):
            for line in part.read_text().splitlines():
                row = json.loads(line)
                assert row["user_id"] not in written, f"two rows for {row['user_id']} in batch {batch_id}"
                written[row["user_id"]] = (row["batch_id"], row["spent"], row["events"])
        assert written == expected, f"batch {batch_id}"
    users = sorted(spent)
    with StatehouseClient(list(urls)) as client:
        job_client = client.job(job)
        columns = job_client.columns()
        assert columns.get("spent", users).tolist() == [spent[u] for u in users]
        assert columns.get("events", users).tolist() == [events[u] for u in users]


@pytest.mark.parametrize("arrow", [False, True], ids=["applyInPandas", "applyInArrow"])
def test_grouped_updates_equal_the_oracle_with_one_attempt_per_task(spark, tmp_path, two_replicas, job_name, arrow):
    urls = [s.url for s in two_replicas]
    batches = make_events(21, files=3, per_file=60)
    write_files(tmp_path / "input", batches)
    query, messages = run_grouped(spark, tmp_path, urls, job_name, arrow=arrow)
    assert query.exception() is None
    check(tmp_path, urls, job_name, batches)
    for batch_id, batch in enumerate(batches):
        # One message per task (4 shuffle partitions), not per group (each user is a group),
        # and they count every write: two per event.
        assert len(messages[batch_id]) <= 4 < len({e["user_id"] for e in batch}), messages[batch_id]
        assert len({m.attempt for m in messages[batch_id]}) == len(messages[batch_id])
        assert sum(sum(m.ops) for m in messages[batch_id]) == 2 * len(batch)


def test_a_grouped_task_failing_after_some_groups_is_retried_and_counted_once(spark, tmp_path, two_replicas, job_name):
    urls = [s.url for s in two_replicas]
    batches = make_events(22, files=3, per_file=60)
    write_files(tmp_path / "input", batches)
    marker = str(tmp_path / "failed")
    groups = defaultdict(int)

    def fail_after_two_groups(ctx):
        # The task has reported its first group and written its second, then dies: nothing of
        # it may count.
        groups[ctx.attempt.attempt] += 1
        if ctx.batch_id == 1 and groups[ctx.attempt.attempt] == 2 and marker_once(marker):
            raise RuntimeError("injected task failure after two groups")

    query, messages = run_grouped(spark, tmp_path, urls, job_name, on_group=fail_after_two_groups)
    assert query.exception() is None
    assert (tmp_path / "failed").exists()  # Spark retried the task
    check(tmp_path, urls, job_name, batches)
    assert sum(sum(m.ops) for m in messages[1]) == 2 * len(batches[1])
