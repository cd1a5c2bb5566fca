"""The Spark driver SIGKILLed at each step of the exactly-once protocol, then restarted from its Spark
checkpoint: every user's state equals a plain-Python oracle over all input (nothing lost, nothing twice).

Each case runs real local Spark in a child session (tests/support/spark_driver.py) against two RocksDB replicas,
killed during micro-batch 1; then the query restarts from its Spark checkpoint in the tests' own Spark
session: a restarted driver resumes from that checkpoint and the replicas only (the dead JVM is gone
either way). Each case's driver process is started while the case before runs (its JVM up and warmed
by a small job of its own, ``--args-from``), and is handed the case's arguments when the case begins:
what it runs against Statehouse and its input, it runs after that. The row-wise job is killed
at every step; the columnar job where its tasks' staged rows are in play (a task dead after staging them, the
epoch sealed over them, one replica committed them and the other not): the other steps are the driver's
own, the same calls for both jobs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
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


class Drivers:
    """The cases' driver processes, each in a session of its own, started one case ahead: a case takes the
    driver started before it, starts the next case's, and hands its own its arguments."""

    def __init__(self, directory: Path, cases: int) -> None:
        self.directory, self.left = directory, cases
        self.started = 0
        self.ahead: tuple[subprocess.Popen, Path, Path] | None = None

    def start(self) -> tuple[subprocess.Popen, Path, Path]:
        self.started += 1
        log, given = self.directory / f"driver-{self.started}.log", self.directory / f"args-{self.started}.json"
        args = [sys.executable, "-m", "tests.support.spark_driver", "--args-from", str(given)]
        with open(log, "wb") as out:
            process = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return process, log, given

    def run(self, args: list[str]) -> tuple[int, Path]:
        """Run a driver with ``args``; its exit code and log. Whatever is left of its session is killed."""
        driver, log, given = self.ahead or self.start()
        self.left -= 1
        self.ahead = self.start() if self.left > 0 else None
        aside = given.with_suffix(".part")
        aside.write_text(json.dumps(args))
        aside.replace(given)  # the driver never reads half a file
        try:
            return driver.wait(RUN_TIMEOUT), log
        finally:
            kill_session(driver.pid)  # the JVM and pyspark's workers on a timeout, or a failed self-kill
            driver.wait(10)

    def close(self) -> None:
        if self.ahead is not None:
            kill_session(self.ahead[0].pid)
            self.ahead[0].wait(10)


@pytest.fixture(scope="module")
def drivers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drivers]:
    cases = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    pool = Drivers(tmp_path_factory.mktemp("drivers"), len(cases))
    try:
        yield pool
    finally:
        pool.close()


def run_driver(
    drivers: Drivers, tmp_path: Path, urls: list[str], job: str, pipeline: str, kill_at: str
) -> tuple[int, Path]:
    """Run the driver, killed at ``kill_at``; its exit code and log."""
    args = ["--job", job, "--statehouse", ",".join(urls), "--pipeline", pipeline]
    args += ["--input", str(tmp_path / "input"), "--output", str(tmp_path / "output")]
    args += ["--checkpoint", str(tmp_path / "spark-checkpoint")]
    args += ["--kill-at", kill_at, "--kill-batch", str(KILL_BATCH), "--kill-record", str(tmp_path / "killed")]
    return drivers.run(args)


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
    spark: Any, tmp_path: Path, replicas: list[str], drivers: Drivers, pipeline: str, step: str
) -> None:
    job = f"kill-{pipeline}-{step}"
    batches = make_events(11, files=3, per_file=60)
    write_files(tmp_path / "input", batches)

    code, killed_log = run_driver(drivers, tmp_path, replicas, job, pipeline, kill_at=step)
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
