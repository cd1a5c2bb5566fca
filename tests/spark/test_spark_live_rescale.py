"""The test that matters: a real local Spark streaming query keeps running while its replica
set is rescaled 2 -> 3 and later 3 -> 2, live, over real S3 (SeaweedFS), with faults around each cut.

The driver (tests/support/rescale_driver.py, a session of its own) runs 8 micro-batches, one input file each,
and rescales through ``MicroBatchCoordinator.rescale`` at two batch boundaries. Around the cut to 3: the
new replica is SIGKILLed once it has loaded its key groups and restarted in place; the driver is SIGKILLed
with commit decided and not applied, and restarted (``recover()`` finishes the move, the query goes on); a
task of the first batch on the new layout fails once and Spark retries it. Around the cut to 2: the leaving
replica is SIGKILLed once it froze its key groups and restarted; the driver is SIGKILLed with every load
done and nothing decided, and restarted (``recover()`` undoes the move; the batch asks for it again); a
task fails once again. Afterwards every user's state equals a plain-Python oracle over all input (nothing
lost, nothing twice) and every replica stores only its own key groups under the final layout.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from statehouse.client import StatehouseClient
from statehouse.client.coordinator import MicroBatchCoordinator
from tests.support.features_pipeline import assert_matches, make_events, reference, state_of, write_files
from tests.support.replica_set import ReplicaSet, holders, misplaced
from tests.support.s3server import s3_env
from tests.support.server import REPO
from tests.support.spark_driver import kill_session

pytestmark = [pytest.mark.http, pytest.mark.spark, pytest.mark.s3, pytest.mark.slow]

JOB = "live-rescale"
MAX_PARALLELISM = 128  # user_features.setup's default
STATES = ["total_spent", "avg_amount", "recent_items", "item_counts"]
BATCHES = 8
# The first micro-batch on 3 replicas, and on 2 again: batches 0-1 run on 2 replicas, 2-4 on 3 (a task of
# the first retried), 5-7 on 2 again (likewise).
GROW_AT, SHRINK_AT = 2, 5
RUN_LIMIT = 240.0  # a ceiling for one driver run that hangs, not a timed assertion


@pytest.fixture
def replica_set(tmp_path: Path, s3_server) -> Iterator[ReplicaSet]:
    storage = s3_env(s3_server.endpoint, uuid.uuid4().hex, s3_server.bucket)
    replicas = ReplicaSet(tmp_path / "replicas", storage, extra={"STATEHOUSE_NUM_RETAINED": "50"})
    try:
        yield replicas
    finally:
        replicas.stop()


class Driver:
    """One run of the driver in a session of its own; whatever is left of the session is killed after."""

    def __init__(self, tmp_path: Path, seeds: list[str]) -> None:
        self.tmp_path, self.seeds, self.runs = tmp_path, seeds, 0
        self.markers = tmp_path / "markers"
        self.markers.mkdir()

    def start(self, *extra: str) -> tuple[subprocess.Popen, Path]:
        self.runs += 1
        log = self.tmp_path / f"driver-{self.runs}.log"
        args = [
            sys.executable,
            "-m",
            "tests.support.rescale_driver",
            "--job",
            JOB,
            "--statehouse",
            ",".join(self.seeds),
        ]
        args += ["--input", str(self.tmp_path / "input"), "--output", str(self.tmp_path / "output")]
        args += ["--checkpoint", str(self.tmp_path / "spark-checkpoint"), "--markers", str(self.markers)]
        args += [*extra] + (["--recover"] if self.runs > 1 else [])
        with open(log, "wb") as out:
            process = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return process, log

    def finish(self, process: subprocess.Popen) -> int:
        try:
            return process.wait(RUN_LIMIT)
        finally:
            kill_session(process.pid)
            process.wait(10)

    def kill_replica_when_held(self, process: subprocess.Popen, count: int, replicas: ReplicaSet, index: int) -> None:
        """Once the driver holds the rescale to ``count``: SIGKILL replica ``index``, restart it in place, let go."""
        held = self.markers / f"held-{count}"
        deadline = time.monotonic() + RUN_LIMIT
        while not held.exists():
            assert process.poll() is None, f"the driver ended ({process.returncode}) before its hold"
            assert time.monotonic() < deadline, "the driver never reached its hold"
            time.sleep(0.05)
        replicas.restart(index)
        (self.markers / f"go-{count}").touch()


def tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-80:])


def decision(url: str, version: int) -> str | None:
    response = httpx.get(f"{url}/v1/topology/decision", params={"version": version}, timeout=30)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return response.json()["outcome"]


def test_live_rescale_under_a_running_query_matches_the_oracle(tmp_path: Path, replica_set: ReplicaSet) -> None:
    batches = make_events(30, files=BATCHES, per_file=40, users=80)
    write_files(tmp_path / "input", batches)
    seeds = replica_set.start(2)
    new = replica_set.add(2, 3, version=2)  # started empty, as the operator would before the rescale
    three = [*seeds, new.url]
    plan = ["--rescale", f"{GROW_AT}:3:{','.join(three)}", "--rescale", f"{SHRINK_AT}:2:{','.join(seeds)}"]
    plan += ["--fail-task", str(GROW_AT), "--fail-task", str(SHRINK_AT)]
    driver = Driver(tmp_path, seeds)

    # Cut 1 (2 -> 3): the new replica killed once loaded, then the driver with commit decided.
    process, log = driver.start(*plan, "--hold", f"load:3:{new.url}", "--kill-at", "before-commit", "--kill-to", "3")
    driver.kill_replica_when_held(process, 3, replica_set, 2)
    assert driver.finish(process) == -9, tail(log)
    assert (driver.markers / "killed").read_text().split() == ["before-commit"], tail(log)
    assert decision(seeds[0], 2) == "commit"

    # Cut 2 (3 -> 2): the leaving replica killed once frozen, then the driver with nothing decided.
    process, log = driver.start(*plan, "--hold", f"prepare:2:{new.url}", "--kill-at", "before-decide", "--kill-to", "2")
    driver.kill_replica_when_held(process, 2, replica_set, 2)
    assert driver.finish(process) == -9, tail(log)
    assert (driver.markers / "killed").read_text().split() == ["before-commit", "before-decide"], tail(log)
    assert decision(seeds[0], 3) is None
    assert (driver.markers / f"task-failed-{GROW_AT}").exists(), tail(log)  # the first batch on 3 ran, with a retry

    # The restarted driver undoes the undecided move, asks for it again at its batch and runs to the end.
    process, log = driver.start(*plan)
    assert driver.finish(process) == 0, tail(log)
    assert (driver.markers / f"task-failed-{SHRINK_AT}").exists(), tail(log)

    urls = replica_set.urls
    with StatehouseClient(seeds) as client:
        shown = client.topology()
        completed = MicroBatchCoordinator(client.job(JOB)).completed()
    assert [(t["replica_index"], t["replica_count"]) for t in shown] == [(0, 2), (1, 2)]
    assert completed[-1].metadata["batch_id"] == BATCHES - 1

    expected = reference(batches)
    assert_matches(state_of(seeds, JOB, expected), expected)
    # Every key on its Flink owner under the final layout only; the removed replica keeps nothing.
    assert misplaced(urls, JOB, STATES, MAX_PARALLELISM, count=2) == {state: [] for state in STATES}
    assert all(len(at) == 1 for at in holders(urls, JOB, "total_spent", MAX_PARALLELISM).values())
    assert set(holders(urls, JOB, "total_spent", MAX_PARALLELISM)) == set(expected)
