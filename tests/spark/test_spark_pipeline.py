"""The user-features Structured Streaming job on real local Spark against real replicas:
end to end, a batch that fails midway, and a rescale from 2 to 3 replicas."""

import contextlib
import json
import os
import random
from collections import Counter, defaultdict

import pytest

from docs.examples import user_features, user_features_columnar
from docs.examples.streaming import start_json_stream
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.coordinator import MicroBatchCoordinator
from tests.support.server import start_server

pytestmark = [pytest.mark.http, pytest.mark.spark]


def make_events(seed, files, per_file, users=25):
    rng = random.Random(seed)
    items = ["book", "pen", "ink", "lamp", "mug", "desk"]
    return [
        [
            {
                "user_id": f"user-{rng.randrange(users)}",
                "item": rng.choice(items),
                "amount": float(rng.randrange(1, 500)),
                "event_time": f"2026-11-23T00:{f:02d}:{i % 60:02d}Z",
            }
            for i in range(per_file)
        ]
        for f in range(files)
    ]


def write_files(directory, batches, start=0):
    directory.mkdir(parents=True, exist_ok=True)
    for n, events in enumerate(batches, start):
        path = directory / f"events-{n:03d}.json"
        path.write_text("".join(json.dumps(e) + "\n" for e in events))


def reference(batches):
    """Each user's state computed in plain Python."""
    amounts, items = defaultdict(list), defaultdict(list)
    for events in batches:
        for e in events:
            amounts[e["user_id"]].append(e["amount"])
            items[e["user_id"]].append(e["item"])
    return {
        u: {
            "total_spent": sum(amounts[u]),
            "avg_amount": sum(amounts[u]) / len(amounts[u]),
            "recent_items": sorted(items[u]),
            "item_counts": dict(Counter(items[u])),
        }
        for u in amounts
    }


def state_of(urls, job, users):
    with StatehouseClient(list(urls)) as client:
        j = client.job(job)
        with j.batch() as reads:
            pending = {
                u: {s: reads.get(s, u) for s in ("total_spent", "avg_amount", "recent_items", "item_counts")}
                for u in users
            }
    return {
        u: {
            "total_spent": p["total_spent"].value,
            "avg_amount": p["avg_amount"].value,
            "recent_items": sorted(p["recent_items"].value or []),
            "item_counts": p["item_counts"].value,
        }
        for u, p in pending.items()
    }


def assert_matches(actual, expected):
    assert set(actual) == set(expected)
    for user, features in expected.items():
        got = actual[user]
        assert got["total_spent"] == pytest.approx(features["total_spent"]), user
        assert got["avg_amount"] == pytest.approx(features["avg_amount"]), user
        assert got["recent_items"] == features["recent_items"], user
        assert got["item_counts"] == features["item_counts"], user


def event_stream(spark, tmp_path, for_each_batch):
    """A query of the events in ``tmp_path/input`` into ``for_each_batch``, one file per
    micro-batch, started (not awaited)."""
    return start_json_stream(
        spark,
        user_features.EVENT_SCHEMA,
        input_dir=str(tmp_path / "input"),
        checkpoint_dir=str(tmp_path / "chk"),
        for_each_batch=for_each_batch,
    )


# The user-features jobs, row-wise and columnar (mapInPandas), over the same ``tmp_path/input``:
# each with its own output and Spark checkpoint directories.
JOBS = {
    "rows": (user_features, "output", "spark-checkpoint"),
    "columnar": (user_features_columnar, "columnar-output", "columnar-checkpoint"),
}


def start_query(spark, tmp_path, config, job, path="rows", **kwargs):
    """The user-features query of ``path`` (``rows`` or ``columnar``) over ``tmp_path/input``,
    started (not awaited)."""
    pipeline, output, checkpoint = JOBS[path]
    pipeline.setup(config, job)
    return pipeline.start(
        spark,
        input_dir=str(tmp_path / "input"),
        output_dir=str(tmp_path / output),
        checkpoint_dir=str(tmp_path / checkpoint),
        config=config,
        job=job,
        **kwargs,
    )


def run(spark, tmp_path, urls, job, **kwargs):
    """:func:`start_query`, run until it has caught up."""
    query = start_query(spark, tmp_path, ClientConfig.of(list(urls)), job, **kwargs)
    with contextlib.suppress(Exception):  # a failed query re-raises here; callers check query.exception()
        query.awaitTermination(240)
    return query


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
    new = [
        start_server(
            tmp_path_factory.mktemp(f"rescaled-{i}"),
            {"STATEHOUSE_REPLICA_INDEX": str(i), "STATEHOUSE_REPLICA_COUNT": "3", "STATEHOUSE_CHECKPOINT_DIR": storage},
        )
        for i in range(3)
    ]
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
