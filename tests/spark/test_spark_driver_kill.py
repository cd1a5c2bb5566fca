"""The Spark driver SIGKILLed at each step of the exactly-once protocol, then restarted from its Spark
checkpoint: every user's state equals a plain-Python oracle over all input (nothing lost, nothing twice).

Each case runs real local Spark in a child session (tests/support/spark_driver.py) against two RocksDB replicas,
killed during micro-batch 1; then the query restarts from its Spark checkpoint in the tests' own Spark
session: a restarted driver resumes from that checkpoint and the replicas only (the dead JVM is gone
either way), and a second driver process per case was a second JVM start. The row-wise job is killed
at every step; the columnar job where its tasks' staged rows are in play (a task dead after staging them, the
epoch sealed over them, one replica committed them and the other not): the other steps are the driver's
own, the same calls for both jobs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.coordinator import MicroBatchCoordinator
from tests.support.features_pipeline import assert_matches, make_events, reference, state_of, write_files
from tests.support.server import REPO
from tests.support.spark_driver import STEPS, kill_session
from tests.support.spark_driver import run as run_query

pytestmark = [pytest.mark.http, pytest.mark.spark, pytest.mark.slow]

# Every step through the row door; the columnar door shares the coordinator, so make test kills its
# driver mid-commit, make test-long at its other steps too.
CASES = [pytest.param("rows", step, id=f"rows-{step}") for step in STEPS] + [
    pytest.param("columnar", step, id=f"columnar-{step}", marks=() if step == "mid-commit" else pytest.mark.long)
    for step in ("mid-task", "before-commit", "mid-commit")
]
KILL_BATCH = 1  # >= 1: batch 0's begin takes the baseline checkpoint, which before-checkpoint must not hit
RUN_TIMEOUT = 240.0

# What the kill left behind, so each case shows it hit its step: the last checkpointed batch; per replica,
# its committed epoch (the anchor checkpoint's or the killed batch's new one) and the new epoch's status.
AFTER_KILL: dict[str, tuple[int, list[str], list[str] | None]] = {
    "mid-task": (0, ["anchor", "anchor"], None),  # open where the killed task staged (checked below)
    "before-prepare": (0, ["anchor", "anchor"], ["open", "open"]),
    "before-commit": (0, ["anchor", "anchor"], ["sealed", "sealed"]),
    "mid-commit": (0, ["new", "anchor"], ["committed", "sealed"]),
    "before-checkpoint": (0, ["new", "new"], ["committed", "committed"]),
    "after-checkpoint": (1, ["anchor", "anchor"], ["committed", "committed"]),
}


def run_driver(tmp_path: Path, urls: list[str], job: str, pipeline: str, log: Path, kill_at: str) -> int:
    """Run the driver in a session of its own; whatever is left of that session afterwards is killed."""
    args = [sys.executable, "-m", "tests.support.spark_driver", "--job", job, "--statehouse", ",".join(urls)]
    args += ["--pipeline", pipeline]
    args += ["--input", str(tmp_path / "input"), "--output", str(tmp_path / "output")]
    args += ["--checkpoint", str(tmp_path / "spark-checkpoint")]
    args += ["--kill-at", kill_at, "--kill-batch", str(KILL_BATCH), "--kill-record", str(tmp_path / "killed")]
    with open(log, "wb") as out:
        driver = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return driver.wait(RUN_TIMEOUT)
    finally:
        kill_session(driver.pid)  # the JVM and pyspark's workers on a timeout, or a failed self-kill
        driver.wait(10)


def after_kill(urls: list[str], job: str) -> tuple[int, list[str], list[str]]:
    with StatehouseClient(urls) as client:
        j = client.job(job)
        anchor = [c for c in MicroBatchCoordinator(j).completed() if "batch_id" in c.metadata][-1].metadata
        epoch = j.epoch()
        names = {epoch: "new", anchor["epoch"]: "anchor"}  # after-checkpoint: the new epoch is the anchor's
        committed = [names.get(e, str(e)) for e in j.committed_epochs()]
        statuses = [r.json("GET", f"/v1/jobs/{job}/epochs/{epoch}")["status"] for r in j.replicas]
    return anchor["batch_id"], committed, statuses


def tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-60:])


@pytest.mark.parametrize(("pipeline", "step"), CASES)
def test_driver_killed_then_restarted_matches_oracle(
    spark: Any, tmp_path: Path, replicas: list[str], pipeline: str, step: str
) -> None:
    job = f"kill-{pipeline}-{step}"
    batches = make_events(11, files=3, per_file=60)
    write_files(tmp_path / "input", batches)

    killed_log = tmp_path / "killed.log"
    code = run_driver(tmp_path, replicas, job, pipeline, killed_log, kill_at=step)
    assert code == -9, tail(killed_log)
    assert set((tmp_path / "killed").read_text().split()) == {step}, tail(killed_log)  # two tasks may race

    batch, committed, statuses = after_kill(replicas, job)
    expected_batch, expected_committed, expected_statuses = AFTER_KILL[step]
    assert (batch, committed) == (expected_batch, expected_committed)
    if expected_statuses is None:
        assert "open" in statuses and set(statuses) <= {"open", "none"}, statuses
    else:
        assert statuses == expected_statuses

    paths = [str(tmp_path / name) for name in ("input", "output", "spark-checkpoint")]
    run_query(spark, pipeline, ClientConfig.of(replicas), job, *paths)

    expected = reference(batches)
    assert_matches(state_of(replicas, job, expected), expected)
    # One global checkpoint per batch (and the baseline): none lost, none taken twice.
    with StatehouseClient(replicas) as client:
        completed = MicroBatchCoordinator(client.job(job)).completed()
    assert [c.metadata.get("batch_id") for c in completed] == [-1, 0, 1, 2]
    # The sink is idempotent: each batch's features were (re)written in full, the last ones are final.
    latest: dict[str, dict] = {}
    for batch_id in range(3):
        directory = tmp_path / "output" / f"batch_id={batch_id}"
        assert (directory / "_SUCCESS").exists(), batch_id
        for part in sorted(directory.glob("*.json")):
            for line in part.read_text().splitlines():
                row = json.loads(line)
                latest[row["user_id"]] = row
    assert set(latest) == set(expected)
    for user, row in latest.items():
        assert row["total_spent"] == pytest.approx(expected[user]["total_spent"]), user
        assert row["item_counts"] == expected[user]["item_counts"], user
