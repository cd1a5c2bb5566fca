"""The user-features Structured Streaming job under test (docs/examples): its input events, the
oracle of the state they leave, that state read back, the query started over a directory of
files; and the exactly-once checks the Spark tests run on it (a task that fails once, a replica
killed mid-batch)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from collections import Counter, defaultdict

import httpx
import pytest

from docs.examples import user_features, user_features_columnar
from docs.examples.streaming import start_json_stream
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.coordinator import MicroBatchCoordinator
from tests.support.server import start_server


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


# Spark's file source takes the oldest files first (maxFilesPerTrigger 1: one per micro-batch), by
# modification time; files written in one tick (on tmpfs, the test directories' filesystem where the
# machine has one, a whole batch of them) would be taken in the order the directory lists them.
_FIRST_MTIME = int(time.time()) - 86_400


def write_input_file(directory, n, rows):
    """Input file ``n`` of a stream: its rows as JSON lines, modified ``n`` seconds after the first."""
    path = directory / f"events-{n:03d}.json"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.utime(path, (_FIRST_MTIME + n, _FIRST_MTIME + n))
    return path


def write_files(directory, batches, start=0):
    directory.mkdir(parents=True, exist_ok=True)
    for n, events in enumerate(batches, start):
        write_input_file(directory, n, events)


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
