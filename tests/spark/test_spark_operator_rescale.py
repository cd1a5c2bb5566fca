"""The test that matters for rescaling by anyone, at any time: an operator rescales the replica set from outside,
three times, while a real local Spark exactly-once query runs, and the query never notices more than a wait.

The query (tests/support/operator_query.py, the user-features job of docs/spark.md: ``exactly_once`` +
``with_state``, ``local[2,2]``) is configured with the set's ORIGINAL two URLs throughout, also after its restart,
and takes one input file per micro-batch as the test drops them in. Meanwhile, as an operator would, the test runs
the CLI: ``statehouse rescale --to 3`` (the joining replica started empty first, as docs/operations.md says),
started while a micro-batch's commit is held in flight (the move's prepare waits for the batch); ``--to 2`` between
a batch's commit and its checkpoint, after which the removed replica is stopped and its data deleted before that
checkpoint goes out (it fails, and is taken again on the new layout); and ``--to 3`` again, the command paused once
the move is prepared while the next micro-batch begins (it waits for the move), then resumed, with the joining
replica SIGKILLed once loaded and kept down until the old replicas committed, then restarted, and the move finished
with ``--resume``. Around the cuts: a task failing after its writes (Spark retries it) after each one, and the
driver SIGKILLed mid-task once the removed replica is gone, then restarted from the same Spark checkpoint location.
A plain client (built once, with the original URLs) adds 1 to counters of another job the whole time, and keeps
being acknowledged after each move; in make test-long, 16 such clients at once, each adding to keys of its own.

Afterwards: the query never failed (exit 0; only the deliberately killed run -9), it waited at a batch boundary
for a move at least once and retook the checkpoint the shrink failed (its log says so), every user's state equals
a plain-Python oracle, every acknowledged add of the plain client is there exactly once, and every key is stored
only on its Flink owner of the final layout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from statehouse.client import StatehouseClient
from tests.support.features_pipeline import assert_matches, make_events, reference, state_of
from tests.support.replica_set import ReplicaSet, holders, misplaced
from tests.support.s3server import s3_env
from tests.support.server import REPO
from tests.support.spark_driver import kill_session

pytestmark = [pytest.mark.http, pytest.mark.spark, pytest.mark.s3, pytest.mark.slow]

JOB = "operator-rescale"
WRITER_JOB, COUNTERS = "operator-writer", "hits"
MAX_PARALLELISM = 128  # user_features.setup's default
STATES = ["total_spent", "avg_amount", "recent_items", "item_counts"]
# Each step two or three micro-batches after the one before (the retried task's batch among them).
BATCHES = 14
HOLD_AT = 2  # the micro-batch whose commit is in flight when the first grow starts
SHRINK_AT = 5  # the shrink runs between this batch's commit and its checkpoint
KILL_AT = 8  # the driver dies in a task of this batch, once the removed replica is gone
REGROW_AFTER = 10  # the last grow starts as the next batch's file is dropped
FAIL_TASKS = (HOLD_AT + 1, SHRINK_AT + 1, REGROW_AFTER + 2)
LIMIT = 240.0  # a ceiling for a step that hangs, not a timed assertion
STATEHOUSE = str(Path(sys.executable).parent / "statehouse")


@pytest.fixture
def replica_set(tmp_path: Path, s3_server) -> Iterator[ReplicaSet]:
    storage = s3_env(s3_server.endpoint, uuid.uuid4().hex, s3_server.bucket)
    replicas = ReplicaSet(tmp_path / "replicas", storage)
    try:
        yield replicas
    finally:
        replicas.stop()


class Feeder(threading.Thread):
    """Drops input file ``i`` into the query's input directory once micro-batch ``i - 1`` is done and
    ``i < limit`` (written aside, then renamed in: the file source never sees half a file)."""

    def __init__(self, tmp_path: Path, batches: list[list[dict]], markers: Path) -> None:
        super().__init__(name="feeder", daemon=True)
        self.input, self.aside, self.batches, self.markers = tmp_path / "input", tmp_path / "aside", batches, markers
        self.input.mkdir()
        self.aside.mkdir()
        self.limit = 0
        self.dropped = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set() and self.dropped < len(self.batches):
            n = self.dropped
            if n < self.limit and (n == 0 or (self.markers / f"done-{n - 1}").exists()):
                aside = self.aside / f"events-{n:03d}.json"
                aside.write_text("".join(json.dumps(e) + "\n" for e in self.batches[n]))
                os.replace(aside, self.input / aside.name)
                self.dropped += 1
            else:
                time.sleep(0.02)


class CounterWriter(threading.Thread):
    """A plain client (one ``StatehouseClient`` with the original URLs, built once) adding 1 to counters of
    another job through the batch door until stopped: ``acked`` adds per key, ``unsure`` ones (a request
    that failed without a clear answer: applied at most once) and the failures."""

    def __init__(self, seeds: list[str], keys: int = 40, name: str = "counter", pause: float = 0.02) -> None:
        super().__init__(name=f"{name}-writer", daemon=True)
        self.client = StatehouseClient(seeds)
        self.keys = [f"{name}-{i}" for i in range(keys)]
        self.pause = pause
        self.acked: Counter[str] = Counter()
        self.unsure: Counter[str] = Counter()
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        job = self.client.job(WRITER_JOB)
        n = 0
        while not self.halt.is_set():
            key = self.keys[n % len(self.keys)]
            n += 1
            try:
                with job.batch() as batch:
                    batch.add(COUNTERS, key, 1)
            except Exception as exc:  # recorded: the assertions show it
                self.unsure[key] += 1
                self.failures.append(f"{type(exc).__name__}: {exc}")
            else:
                self.acked[key] += 1
            time.sleep(self.pause)

    def progress(self, adds: int = 20) -> None:
        """Until ``adds`` more adds have been acknowledged."""
        target = sum(self.acked.values()) + adds
        deadline = time.monotonic() + LIMIT
        while sum(self.acked.values()) < target:
            assert self.is_alive() and time.monotonic() < deadline, self.failures[-3:]
            time.sleep(0.05)


class Driver:
    """Runs of tests/support/operator_query.py, each in a session of its own, with the original seeds."""

    def __init__(self, tmp_path: Path, seeds: list[str]) -> None:
        self.tmp_path, self.seeds, self.runs = tmp_path, seeds, 0
        self.markers = tmp_path / "markers"
        self.markers.mkdir()
        self.logs: list[Path] = []

    def start(self, *extra: str) -> subprocess.Popen:
        self.runs += 1
        log = self.tmp_path / f"driver-{self.runs}.log"
        self.logs.append(log)
        args = [
            sys.executable,
            "-m",
            "tests.support.operator_query",
            "--job",
            JOB,
            "--statehouse",
            ",".join(self.seeds),
        ]
        args += ["--input", str(self.tmp_path / "input"), "--output", str(self.tmp_path / "output")]
        args += ["--checkpoint", str(self.tmp_path / "spark-checkpoint"), "--markers", str(self.markers)]
        args += ["--batches", str(BATCHES), *extra] + (["--restart"] if self.runs > 1 else [])
        with open(log, "wb") as out:
            return subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def finish(self, process: subprocess.Popen) -> int:
        try:
            return process.wait(LIMIT)
        finally:
            kill_session(process.pid)
            process.wait(10)

    def await_marker(
        self, name: str, process: subprocess.Popen, or_end: bool = False, within: float | None = None
    ) -> None:
        """Until marker ``name`` exists (or, ``or_end``, the run has ended; or ``within`` seconds have passed)."""
        deadline = time.monotonic() + (within or LIMIT)
        while not (self.markers / name).exists():
            if (or_end and process.poll() is not None) or (within is not None and time.monotonic() > deadline):
                return
            assert process.poll() is None, f"the driver ended ({process.returncode}) before {name}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"no {name}:\n{self.tail()}"
            time.sleep(0.05)

    def waits(self) -> int:
        """How often this run's log says a micro-batch waited at its boundary (for a move or a replica)."""
        log = self.logs[-1].read_text(errors="replace") if self.logs else ""
        return log.count(f"of job '{JOB}' waits for")

    def await_wait(self, before: int, process: subprocess.Popen, within: float) -> None:
        """Until the log says a micro-batch waited more than ``before`` times, the run ended, or ``within`` s."""
        deadline = time.monotonic() + within
        while self.waits() <= before and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def tail(self) -> str:
        return "\n".join(self.logs[-1].read_text(errors="replace").splitlines()[-60:]) if self.logs else ""


class Operator:
    """``statehouse rescale`` from outside, as an operator runs it: each command's stderr (its progress) kept."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path, self.runs = tmp_path, 0
        self.logs: list[Path] = []

    def start(self, *args: str) -> tuple[subprocess.Popen, Path]:
        self.runs += 1
        log = self.tmp_path / f"rescale-{self.runs}.log"
        self.logs.append(log)
        env = {k: v for k, v in os.environ.items() if not k.startswith("STATEHOUSE_")}
        with open(log, "wb") as out:
            command = [STATEHOUSE, "rescale", *args, "--wait", "120"]
            return subprocess.Popen(command, cwd=self.tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT), log

    def run(self, *args: str) -> tuple[int, str]:
        process, log = self.start(*args)
        return self.finish(process), log.read_text(errors="replace")

    @staticmethod
    def finish(process: subprocess.Popen) -> int:
        try:
            return process.wait(LIMIT)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)

    @staticmethod
    def await_line(process: subprocess.Popen, log: Path, text: str, or_end: bool = False) -> bool:
        """Until the command's output has ``text`` (polled often: a kill on a progress line races the next
        step); whether it has (``or_end``: False when the command ended first)."""
        deadline = time.monotonic() + LIMIT
        while text not in log.read_text(errors="replace"):
            ended = process.poll()
            if or_end and ended is not None:
                return text in log.read_text(errors="replace")
            assert ended is None, f"the command ended ({ended}) before {text!r}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no {text!r}:\n{log.read_text()}"
            time.sleep(0.005)
        return True


def topology(url: str) -> dict:
    return httpx.get(f"{url}/v1/topology", timeout=30).json()


class CounterWriters:
    """``count`` plain clients at once, each a :class:`CounterWriter` of its own keys: the long-lived
    clients of many services beside the query, each of which must keep being acknowledged after every move."""

    def __init__(self, seeds: list[str], count: int) -> None:
        pause = 0.02 * count  # the same request rate in all, whatever the count
        self.each = [CounterWriter(seeds, name=f"client{i}", pause=pause) for i in range(count)]
        self.keys = [key for writer in self.each for key in writer.keys]

    def start(self) -> None:
        for writer in self.each:
            writer.start()

    def progress(self) -> None:
        for writer in self.each:
            writer.progress(adds=max(3, 20 // len(self.each)))

    def stop(self) -> None:
        for writer in self.each:
            writer.halt.set()
        for writer in self.each:
            writer.join(60)
            writer.client.close()

    @property
    def failures(self) -> list[str]:
        return [failure for writer in self.each for failure in writer.failures]

    def bounds(self, key: str) -> tuple[int, int]:
        """The adds of ``key`` acknowledged, and those plus the unsure ones."""
        writer = next(w for w in self.each if key in w.keys)
        return writer.acked[key], writer.acked[key] + writer.unsure[key]


# One plain client in make test; many long-lived clients at once (each built once with the original URLs)
# in make test-long: the operator's moves, the query and the clients of many services, all together.
@pytest.mark.parametrize("clients", [1, pytest.param(16, marks=pytest.mark.long)], ids=["one-client", "16-clients"])
def test_operator_rescales_under_a_running_query_match_the_oracle(
    tmp_path: Path, replica_set: ReplicaSet, clients: int
) -> None:
    batches = make_events(39, files=BATCHES, per_file=30, users=60)
    seeds = replica_set.start(2)
    with StatehouseClient(seeds) as client:
        client.create_job(WRITER_JOB, MAX_PARALLELISM).register(COUNTERS, kind="reducing", function="sum")
    driver = Driver(tmp_path, seeds)
    feeder = Feeder(tmp_path, batches, driver.markers)
    writer = CounterWriters(seeds, clients)
    operator = Operator(tmp_path)
    failed: list[str] = []  # the query's failures (a supervisor restarted it)
    fail = [arg for batch in FAIL_TASKS for arg in ("--fail-task", str(batch))]
    holds = ["--hold-commit", str(HOLD_AT), "--hold-checkpoint", str(SHRINK_AT)]
    query = driver.start(*fail, *holds, "--kill-in-task", str(KILL_AT))
    feeder.limit = HOLD_AT + 1
    feeder.start()
    writer.start()
    try:
        # Grow 2 -> 3, started while micro-batch HOLD_AT's commit is in flight: the move's prepare waits for it.
        joining = replica_set.add(2, 3, version=topology(seeds[0])["version"] + 1)
        driver.await_marker(f"at-commit-{HOLD_AT}", query)
        feeder.limit = SHRINK_AT + 1
        grow, grow_log = operator.start("--to", "3", "--urls", ",".join(seeds), "--urls-new", joining.url)
        operator.await_line(grow, grow_log, "waiting for a micro-batch to end")
        (driver.markers / f"go-commit-{HOLD_AT}").touch()
        assert operator.finish(grow) == 0, grow_log.read_text()
        writer.progress()

        # Shrink 3 -> 2 between a batch's commit and its checkpoint; the removed replica is stopped and its data
        # deleted before the checkpoint goes out (to the layout the batch began under): it fails, and is taken
        # again on the new layout.
        driver.await_marker(f"at-checkpoint-{SHRINK_AT}", query)
        feeder.limit = KILL_AT
        code, shown = operator.run("--to", "2", "--urls", ",".join(seeds))
        assert code == 0, shown
        removed = replica_set.servers[2]
        removed.stop()
        shutil.rmtree(removed.log_path.parent / "data")
        writer.progress()
        (driver.markers / f"go-checkpoint-{SHRINK_AT}").touch()
        driver.await_marker(f"done-{SHRINK_AT}", query)

        # The driver dies in a task of the next batch, and restarts with the same seeds and Spark checkpoint.
        feeder.limit = KILL_AT + 1
        assert driver.finish(query) == -9, driver.tail()
        assert (driver.markers / "killed").read_text().split() == ["mid-task"], driver.tail()
        query = driver.start(*fail)
        feeder.limit = REGROW_AFTER + 1
        joining = replica_set.add(2, 3, version=topology(seeds[0])["version"] + 1)  # empty again, same place

        # Grow 2 -> 3 again. The operator's command is paused (SIGSTOP, as a suspended terminal) once the move is
        # prepared, the moving key groups frozen: the next file's micro-batch begins and waits for the move.
        # Resumed, the command goes on; the joining replica is SIGKILLed once it has loaded, and stays down
        # until the old replicas have committed and the waiting batch has looked again (restarted, it commits
        # itself).
        driver.await_marker(f"done-{REGROW_AFTER}", query)
        regrow, regrow_log = operator.start("--to", "3", "--urls", ",".join(seeds), "--urls-new", joining.url)
        operator.await_line(regrow, regrow_log, "prepared:")
        regrow.send_signal(signal.SIGSTOP)
        try:
            waits = driver.waits()
            feeder.limit = REGROW_AFTER + 2
            driver.await_marker(f"begun-{REGROW_AFTER + 1}", query)
            driver.await_wait(waits, query, within=LIMIT)
            assert "waits for a live rescale" in driver.logs[-1].read_text(errors="replace"), driver.tail()
        finally:
            regrow.send_signal(signal.SIGCONT)
        operator.await_line(regrow, regrow_log, "loaded:")
        waits = driver.waits()
        replica_set.servers[2].stop(signal.SIGKILL)
        # Unless the move committed on it before the kill landed (then it is restarted at once).
        if operator.await_line(regrow, regrow_log, "waiting (unreachable) for commit", or_end=True):
            driver.await_wait(waits, query, within=5)  # the batch waits again, for the move or the replica
        replica_set.restart(2)
        feeder.limit = BATCHES
        code = operator.finish(regrow)
        assert code in (0, 4), regrow_log.read_text()  # 4: a replica did not commit; --resume finishes
        code, shown = operator.run("--resume", "--urls", ",".join(seeds))
        assert code == 0, shown
        writer.progress()

        # A query that failed is restarted, as its supervisor would: the rest is checked, then the failure shown.
        while (code := driver.finish(query)) != 0:
            failed.append(f"driver run {driver.runs} exited {code}:\n{driver.tail()}")
            assert len(failed) < 3, "\n".join(failed)
            query = driver.start(*fail)
    finally:
        if query.poll() is None:  # a failed step: whatever is left of the driver's session
            kill_session(query.pid)
        feeder.halt.set()
        writer.stop()
    assert feeder.dropped == BATCHES

    logs = "\n".join(log.read_text(errors="replace") for log in driver.logs)
    assert "waits for a live rescale" in logs, driver.tail()
    assert f"the checkpoint of micro-batch {SHRINK_AT} met a live rescale" in logs, driver.tail()
    assert all((driver.markers / f"task-failed-{batch}").exists() for batch in FAIL_TASKS)

    urls = replica_set.urls
    shown_topology = [topology(url) for url in urls]
    assert [(t["replica_index"], t["replica_count"]) for t in shown_topology] == [(0, 3), (1, 3), (2, 3)]

    expected = reference(batches)
    assert_matches(state_of(seeds, JOB, expected), expected)

    # An add fails only while its key group's owner is down: the joining replica killed mid-move, after the commit.
    assert [f for f in writer.failures if not (f.startswith("Unavailable") and joining.url in f)] == []
    with StatehouseClient(seeds) as client, client.job(WRITER_JOB).batch() as reads:
        counted = {key: reads.get(COUNTERS, key) for key in writer.keys}
    totals = {key: counted[key].value or 0 for key in writer.keys}
    wrong = {
        key: (totals[key], *writer.bounds(key))
        for key in writer.keys
        if not writer.bounds(key)[0] <= totals[key] <= writer.bounds(key)[1]
    }
    assert wrong == {}, "acknowledged adds lost or doubled: (total, acked, acked + unsure)"
    assert all(sum(each.acked.values()) > 0 for each in writer.each)

    # Every key on its Flink owner under the final layout only.
    assert misplaced(urls, JOB, STATES, MAX_PARALLELISM, count=3) == {state: [] for state in STATES}
    assert misplaced(urls, WRITER_JOB, [COUNTERS], MAX_PARALLELISM, count=3) == {COUNTERS: []}
    held = holders(urls, JOB, "total_spent", MAX_PARALLELISM)
    assert set(held) == set(expected) and all(len(at) == 1 for at in held.values())
    assert failed == [], "the query failed:\n" + "\n".join(failed)  # last: everything else checked first
