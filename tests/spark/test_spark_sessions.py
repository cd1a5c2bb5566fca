"""The sessions Structured Streaming job (docs/examples/sessions.py) on real local Spark against two
real replicas: sessions closed by event-time timers, each exactly once, also when a task dies
after firing its timers and Spark retries it."""

import contextlib
import json
import os
import random
from collections import defaultdict

import pytest

from docs.examples import sessions
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.spark import exactly_once
from tests.support.features_pipeline import marker_once, write_input_file

pytestmark = [pytest.mark.http, pytest.mark.spark]

GAP = 10_000
TICK = 10**12  # a last event far ahead: the watermark passes every session's timer


def make_batches(seed, files=3, per_file=60, users=12):
    rng = random.Random(seed)
    batches = []
    for f in range(files):  # every file's events come after the previous file's
        base = f * 40_000
        batches.append(
            [{"user_id": f"u{rng.randrange(users)}", "ts": base + rng.randrange(30_000)} for _ in range(per_file)]
        )
    batches.append([{"user_id": "tick", "ts": TICK}])
    return batches


def reference(batches):
    """Every user's sessions (but the tick's, which stays open): runs with gaps of at most GAP."""
    times = defaultdict(list)
    for events in batches:
        for e in events:
            times[e["user_id"]].append(e["ts"])
    found = set()
    for user, ts in times.items():
        if user == "tick":
            continue
        ts.sort()
        start = end = ts[0]
        count = 1
        for t in ts[1:]:
            if t <= end + GAP:
                end, count = t, count + 1
            else:
                found.add((user, start, end, count))
                start = end = t
                count = 1
        found.add((user, start, end, count))
    return found


def run(spark, tmp_path, urls, job, batches, **options):
    input_dir = tmp_path / "input"
    input_dir.mkdir()
    for n, events in enumerate(batches):
        write_input_file(input_dir, n, events)
    config = ClientConfig.of(list(urls))
    sessions.setup(config, job)
    query = sessions.start(
        spark,
        input_dir=str(input_dir),
        output_dir=str(tmp_path / "output"),
        checkpoint_dir=str(tmp_path / "spark-checkpoint"),
        config=config,
        job=job,
        gap_ms=GAP,
        partitions=4,
        **options,
    )
    with contextlib.suppress(Exception):
        query.awaitTermination(240)
    assert query.exception() is None
    closed = []
    for part in (tmp_path / "output").glob("batch_id=*/*.json"):
        closed += [json.loads(line) for line in part.read_text().splitlines()]
    return closed


def test_sessions_close_once_each_despite_a_task_retry(spark, tmp_path, two_replicas, job_name):
    urls = [s.url for s in two_replicas]
    batches = make_batches(5)
    marker = str(tmp_path / "failed")

    def fail_after_firing(ctx):
        # Partition 1 of the second batch fired its timers (staged) and wrote; then it dies.
        if ctx.batch_id == 1 and ctx.attempt.partition == 1 and marker_once(marker):
            raise RuntimeError("injected task failure after firing timers")

    closed = run(spark, tmp_path, urls, job_name, batches, on_partition=fail_after_firing)
    got = [(c["user_id"], c["start"], c["end"], c["events"]) for c in closed]
    assert len(got) == len(set(got))  # none closed twice
    assert set(got) == reference(batches)  # every one closed
    assert os.path.exists(marker)  # Spark retried the task
    assert "watermark" in {c["closed_by"] for c in closed}
    with StatehouseClient(list(urls)) as client:
        job = client.job(job_name)
        timers = job.timers("event")
        assert [(t.key, t.timestamp) for t in timers.list()] == [("tick", TICK + GAP)]  # only the open session
        assert timers.times() == [TICK, TICK]


def test_a_replayed_batch_keeps_the_sessions_its_committed_run_closed(spark, tmp_path, two_replicas, job_name):
    """The driver dies after Statehouse committed the last batch and before Spark recorded it:
    Spark runs that batch again. The replay must leave the batch's output (the sessions its
    timers closed, which cannot close twice) as the committed run wrote it."""
    urls = [s.url for s in two_replicas]
    batches = make_batches(7)
    closed = run(spark, tmp_path, urls, job_name, batches)
    last = len(batches) - 1
    output = tmp_path / "output"
    written = sorted(p.read_text() for p in (output / f"batch_id={last}").glob("*.json"))
    assert any(written)  # the tick's watermark closed sessions in the last batch

    config = ClientConfig.of(list(urls))
    replay = exactly_once(config, job_name, sessions.process_batch(str(output), gap_ms=GAP, partitions=4))
    replay(spark.createDataFrame(batches[last], sessions.EVENT_SCHEMA), last)

    assert sorted(p.read_text() for p in (output / f"batch_id={last}").glob("*.json")) == written
    got = {(c["user_id"], c["start"], c["end"], c["events"]) for c in closed}
    assert got == reference(batches)
