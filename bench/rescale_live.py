"""Benchmark 15: live rescale 2 -> 3 -> 2 under a running Spark query, state moved through SeaweedFS S3.

Two RocksDB replicas hold a job of ``--keys`` keys (16-byte keys, 100 random bytes each, 128 key groups)
and the user-features job of a Spark streaming query (``--batches`` micro-batches, one file each); every
checkpoint goes to S3. A third replica starts empty. Who moves the state:

- by default the query's driver rescales the set to 3 replicas before micro-batch ``--grow-at`` and back
  to 2 before ``--shrink-at`` (``MicroBatchCoordinator.rescale``, through tests/support/rescale_driver.py's
  wrapper, as the live-rescale test does): the cut is a batch boundary;
- ``--external``: the query has no rescale plan; this process runs ``statehouse rescale --to 3`` and later
  ``--to 2`` from outside, as an operator does (the CLI as a subprocess, its defaults), each as micro-batch
  ``--grow-at`` / ``--shrink-at`` begins. The batch in flight holds the move's prepare off, a batch that
  begins during the move waits at its boundary; both are marked;
- ``--no-spark``: ``LiveRescale`` alone, no query (with ``--external``: the command's two moves, no query).

Reported per rescale:

- wall time from the request to the new layout serving (every replica committed), split by step
  (prepare, checkpoint, load, decide, commit) as the driver's calls span them, or, ``--external``, as the
  CLI's progress lines (stderr, timed as they arrive) bound them;
- per replica that takes key groups (driver and ``--no-spark``): the bytes its load read from S3 against
  its share, the stored bytes of the key groups it takes (``GET .../sizes`` before the move) and the
  checkpoint's bytes scaled to those key groups;
- CPU seconds of each replica process and of this (driver) process during the rescale, beside the wall;
  ``--external``: of each replica, of the command and of the query (Spark's JVM, the driver's Python);
- every micro-batch's duration (Spark's triggerExecution): the batch(es) that meet a move against the
  batches around them; the machine's load average (``os.getloadavg()``) while the query ran.

The machine is shared (other sessions' tests run beside it): figures of one run spread widely.

    .venv/bin/python -m bench.rescale_live --keys 1000000
    .venv/bin/python -m bench.rescale_live --keys 1000000 --external   # an operator's moves from outside
    .venv/bin/python -m bench.rescale_live --keys 1000000 --no-spark   # LiveRescale alone, no query
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.columnar import process_cpu_ns
from bench.common import print_header, s3_settings, table, write_json
from docs.examples import user_features
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.rescale import LiveRescale
from statehouse.client.transport import ReplicaConnection
from statehouse.protocol.keygroups import KeyGroupRange
from tests.support.replica_set import ReplicaSet
from tests.support.rescale_driver import Rescale, ensure_layout
from tests.support.spark import local_spark

BULK = "bulk"
FEATURES = "features"
MAX_PARALLELISM = 128
STEPS = ("prepare", "checkpoint", "load", "decide", "commit")
STATEHOUSE = str(Path(sys.executable).parent / "statehouse")  # the command, as installed beside this Python
# The CLI's progress lines (client/cli/rescale.py, on stderr) that end each step of a move, in order.
CLI_STEPS = (
    ("prepared", "prepare"),
    ("checkpointed", "checkpoint"),
    ("loaded", "load"),
    ("decided", "decide"),
    ("committed", "commit"),
    ("verified", "verify"),
)
COORDINATOR_LOG = "statehouse.client.coordinator"  # its warnings name the batches that meet a move
HELD = "waiting for a micro-batch to end"  # the CLI's line when a batch in flight refused its prepare
AROUND = 3  # micro-batches on each side of the ones that met a move make its "around" median


@dataclass
class Call:
    url: str
    path: str
    started: float
    ended: float
    answer: Any


@dataclass
class CallLog:
    """The driver's POSTs while a rescale runs (this process's client calls, wrapped: no product hook)."""

    calls: list[Call] = field(default_factory=list)
    recording: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self) -> None:
        original = ReplicaConnection.json

        def json_call(conn: ReplicaConnection, method: str, path: str, body: Any = None, *, idempotent: bool = True):
            started = time.perf_counter()
            answer = original(conn, method, path, body, idempotent=idempotent)
            if self.recording and method == "POST":
                with self.lock:
                    self.calls.append(Call(conn.url.rstrip("/"), path, started, time.perf_counter(), answer))
            return answer

        ReplicaConnection.json = json_call  # type: ignore[method-assign,assignment]

    def steps(self) -> dict[str, float]:
        """Seconds from the first to the last call of each step."""
        spans: dict[str, list[float]] = {}
        for call in self.calls:
            step = step_of(call.path)
            if step is not None:
                spans.setdefault(step, []).extend((call.started, call.ended))
        return {step: max(s) - min(s) for step, s in spans.items()}

    def loads(self) -> dict[str, dict[str, Any]]:
        """Each replica's answer to its (last) load."""
        return {c.url: c.answer for c in self.calls if c.path == "/v1/topology/load"}

    def parts(self, job: str, *, uploaded_only: bool = False) -> dict[str, int]:
        """The bytes of each replica's part of the move's checkpoint of ``job`` (uploaded + reused), or
        (``uploaded_only``) what the move's checkpoint uploaded: its cost on the old replicas."""
        done = [
            c for c in self.calls if c.path.startswith(f"/v1/jobs/{job}/checkpoints/") and c.path.endswith("/complete")
        ]
        reused = 0 if uploaded_only else 1
        return {c.url: c.answer.get("bytes_uploaded", 0) + reused * c.answer.get("bytes_reused", 0) for c in done}


def step_of(path: str) -> str | None:
    if path.startswith("/v1/topology/"):
        return path.rsplit("/", 1)[1]
    if "/checkpoints" in path:
        return "checkpoint"
    return None


def fill(config: ClientConfig, count: int, chunk: int = 20_000) -> None:
    """``count`` keys of 100 random bytes (base64 text: the same value travels as JSON and msgpack)."""
    import base64

    with StatehouseClient(config) as client:
        job = client.create_job(BULK, MAX_PARALLELISM)
        job.register("v", "value")
        columns = job.columns()
        for start in range(0, count, chunk):
            keys = [f"k{i:015d}" for i in range(start, min(count, start + chunk))]
            values = [base64.b64encode(os.urandom(75)).decode() for _ in keys]
            columns.put("v", keys, values)


def stored_bytes(urls: list[str]) -> dict[int, int]:
    """Stored bytes of the bulk job per key group, from every replica's ``GET .../sizes``."""
    found: dict[int, int] = {}
    for url in urls:
        answer = httpx.get(f"{url}/v1/jobs/{BULK}/states/v/sizes", timeout=600).json()
        for group in answer["key_groups"]:
            found[group["key_group"]] = found.get(group["key_group"], 0) + group["bytes"]
    return found


def moving_in(old: int, new: int, index: int) -> list[int]:
    """The key groups replica ``index`` takes in a rescale ``old`` -> ``new``."""
    owned = KeyGroupRange.for_operator(MAX_PARALLELISM, old, index) if index < old else None
    wanted = KeyGroupRange.for_operator(MAX_PARALLELISM, new, index) if index < new else None
    if wanted is None:
        return []
    return [g for g in range(wanted.start, wanted.end + 1) if owned is None or not owned.start <= g <= owned.end]


def measure(log: CallLog, replicas: ReplicaSet, step: Rescale, rescale: Callable[[], Any]) -> dict[str, Any]:
    """Run ``rescale`` (one rescale to ``step.count``) and measure it: wall from the request to the new
    layout serving (the call returns after every commit), the steps' spans, each load's answer, the
    stored bytes per key group before it, and the CPU of every replica and of this process."""
    old = 2 if step.count == 3 else 3
    sizes = stored_bytes(replicas.urls[:old])
    pids = {s.url: s.process.pid for s in replicas.servers}
    cpu = {url: process_cpu_ns(pid) for url, pid in pids.items()}
    own_cpu = time.process_time()
    log.calls.clear()
    log.recording = True
    started = time.perf_counter()
    try:
        rescale()
    finally:
        wall = time.perf_counter() - started
        log.recording = False
    return {
        "before_batch": step.batch,
        "from": old,
        "to": step.count,
        "wall_s": wall,
        "steps_s": log.steps(),
        "loads": log.loads(),
        "parts": log.parts(BULK),
        "uploaded": log.parts(BULK, uploaded_only=True),
        "sizes": sizes,
        "cpu_s": {url: (process_cpu_ns(pid) - cpu[url]) / 1e9 for url, pid in pids.items()},
        "driver_cpu_s": time.process_time() - own_cpu,
    }


@dataclass
class Timeline:
    """When ``foreachBatch`` ran each micro-batch (this process's monotonic clock), and the batches whose
    begin waited for a live rescale or whose checkpoint met one (the coordinator's warnings, caught by
    :class:`CoordinatorLog`)."""

    begun: dict[int, float] = field(default_factory=dict)
    ended: dict[int, float] = field(default_factory=dict)
    waits: dict[int, list[float]] = field(default_factory=dict)  # batch -> [wait logged, "goes on" logged]
    checkpoint_met: set[int] = field(default_factory=set)
    changed: threading.Condition = field(default_factory=threading.Condition)
    finished: bool = False

    def wrap(self, run: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        def wrapped(df: Any, batch_id: int) -> None:
            with self.changed:
                self.begun[batch_id] = time.monotonic()
                self.changed.notify_all()
            try:
                run(df, batch_id)
            finally:
                self.ended[batch_id] = time.monotonic()

        return wrapped

    def await_begun(self, batch: int) -> bool:
        """Wait until micro-batch ``batch`` begins (True) or the query ended first (False)."""
        with self.changed:
            self.changed.wait_for(lambda: batch in self.begun or self.finished)
            return batch in self.begun

    def finish(self) -> None:
        with self.changed:
            self.finished = True
            self.changed.notify_all()


class CoordinatorLog(logging.Handler):
    """The coordinator's warnings of a micro-batch meeting a live rescale, timed into a :class:`Timeline`."""

    def __init__(self, timeline: Timeline) -> None:
        super().__init__(logging.WARNING)
        self.timeline = timeline

    def emit(self, record: logging.LogRecord) -> None:
        message = str(record.msg)
        batch = record.args[0] if isinstance(record.args, tuple) and record.args else None
        if not isinstance(batch, int):
            return
        print(f"driver log: {record.getMessage()}", file=sys.stderr, flush=True)  # as the driver's log shows it
        if message.startswith("micro-batch %d of job %r waits for a live rescale") or message.startswith(
            "micro-batch %d of job %r goes on after the live rescale"
        ):
            self.timeline.waits.setdefault(batch, []).append(time.monotonic())
        elif message.startswith("the checkpoint of micro-batch %d met a live rescale"):
            self.timeline.checkpoint_met.add(batch)


class LoadSampler:
    """The machine's 1-minute load average (``os.getloadavg()``) every ``every`` seconds, from a thread."""

    def __init__(self, every: float = 2.0) -> None:
        self.every = every
        self.samples: list[tuple[float, float]] = []  # (monotonic time, load)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), os.getloadavg()[0]))
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self, start: float = 0.0, end: float = float("inf")) -> dict[str, float]:
        """Min, mean and max of the samples from ``start`` to ``end`` (the latest sample before
        ``start`` included: a short span may hold none of its own)."""
        inside = [load for t, load in self.samples if start <= t <= end]
        before = [load for t, load in self.samples if t < start]
        values = inside + before[-1:] or [os.getloadavg()[0]]
        return {"min": min(values), "mean": statistics.fmean(values), "max": max(values)}


def operator_rescale(
    replicas: ReplicaSet, step: Rescale, workdir: Path, load: LoadSampler, query: dict[str, int] | None = None
) -> dict[str, Any]:
    """Run ``statehouse rescale --to M`` from outside, as an operator does (the command as a subprocess,
    its defaults, no STATEHOUSE_* environment), and time it: from the request (the command's start) to
    each progress line on its stderr, to the new layout serving (its ``committed`` line: every replica
    committed) and to its exit; beside it the CPU of every replica, of the command and of the query's
    processes (``query``: name -> pid)."""
    old = 2 if step.count == 3 else 3
    urls = replicas.urls[:old]
    added = [url for url in step.urls if url not in urls]
    command = [STATEHOUSE, "rescale", "--to", str(step.count), "--urls", ",".join(urls)]
    command += ["--urls-new", ",".join(added)] if added else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATEHOUSE_")}
    pids = {s.url: s.process.pid for s in replicas.servers}
    cpu = {url: process_cpu_ns(pid) for url, pid in pids.items()}
    query = query or {}
    query_cpu = {name: process_cpu_ns(pid) for name, pid in query.items()}
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stderr is not None
    stdout: list[str] = []
    reader = threading.Thread(target=lambda: stdout.append(process.stdout.read()))  # type: ignore[union-attr]
    reader.start()
    lines = [(time.monotonic() - started, line.rstrip("\n")) for line in process.stderr]
    _, status, usage = os.wait4(process.pid, 0)  # its rusage: the command's own CPU
    exited = time.monotonic()
    process.returncode = os.waitstatus_to_exitcode(status)
    reader.join()
    text = "".join(stdout)
    if process.returncode != 0:
        shown = "\n".join(line for _, line in lines)
        raise RuntimeError(f"{' '.join(command)} exited {process.returncode}:\n{shown}\n{text}")
    steps, at = cli_steps(lines)
    reported = re.search(r" in (\d+(?:\.\d+)?)s\b", text)
    return {
        "requested_as_batch": step.batch,
        "from": old,
        "to": step.count,
        "command": ["statehouse", *command[1:]],
        "t0": started,
        "serving_s": at["committed"],
        "exit_s": exited - started,
        "command_s": float(reported.group(1)) if reported else None,  # the command's own "in X s"
        "steps_s": steps,
        "lines": lines,
        "stdout": text,
        "cpu_s": {url: (process_cpu_ns(pid) - cpu[url]) / 1e9 for url, pid in pids.items()},
        "cli_cpu_s": usage.ru_utime + usage.ru_stime,
        "query_cpu_s": {name: (process_cpu_ns(pid) - query_cpu[name]) / 1e9 for name, pid in query.items()},
        "load": load.summary(started, exited),
    }


def query_processes(spark: Any) -> dict[str, int]:
    """The query's processes: this one (the driver's Python) and Spark's JVM (the launcher PySpark
    started execs it), when the session shows it."""
    found = {"driver (Python)": os.getpid()}
    launched = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    if launched is not None:
        found["Spark JVM"] = launched.pid
    return found


def cli_steps(lines: list[tuple[float, str]]) -> tuple[dict[str, float], dict[str, float]]:
    """Each step's seconds as the CLI's progress lines bound it (``prepare``: from the request, so the
    command's start, its checks and any wait for a batch in flight; each next step from the line
    before; ``held``: from its first wait for a micro-batch to end to its prepare), and when each line
    first came, from the request."""
    at: dict[str, float] = {}
    for t, line in lines:
        at.setdefault(line.split(":", 1)[0], t)
    steps: dict[str, float] = {}
    last = 0.0
    for word, step in CLI_STEPS:
        if word in at:
            steps[step], last = at[word] - last, at[word]
    held = [t for t, line in lines if line.startswith(HELD)]
    if held and "prepared" in at:
        steps["held"] = at["prepared"] - held[0]
    return steps, at


def operator_moves(
    plan: list[Rescale],
    timeline: Timeline,
    replicas: ReplicaSet,
    workdir: Path,
    load: LoadSampler,
    rescales: list[dict[str, Any]],
    failures: list[BaseException],
    query: dict[str, int],
) -> None:
    """The operator: each move of ``plan`` is requested as its micro-batch begins (a thread's body)."""
    try:
        for step in plan:
            if not timeline.await_begun(step.batch):
                return
            rescales.append(operator_rescale(replicas, step, workdir, load, query))
    except BaseException as exc:  # reported by the main thread once the query ended
        failures.append(exc)


def meetings(rescales: list[dict[str, Any]], timeline: Timeline) -> dict[int, list[str]]:
    """How each micro-batch met each external move, if it did, with when (seconds from the move's
    request): ``held`` (in flight when the move's prepare was refused: the command waited for it to
    end), ``waited`` (it began during the move and waited at its boundary: when its ``foreachBatch``
    began, when the coordinator logged the wait and when it logged going on), ``checkpoint met`` (its
    checkpoint met the move and was taken again), ``beside`` (it ran while the command started, before
    any prepare, and met nothing but the command's start)."""
    notes: dict[int, list[str]] = {}
    for r in rescales:
        t0, end = r["t0"], r["t0"] + r["serving_s"]
        name = f"{r['from']} → {r['to']}"
        held = [t0 + t for t, line in r["lines"] if line.startswith(HELD)]
        for batch, begun in timeline.begun.items():
            ended = timeline.ended.get(batch, float("inf"))
            if ended < t0 or begun > end:
                continue
            wait = timeline.waits.get(batch)
            if wait and begun <= wait[0] <= end:
                notes.setdefault(batch, []).append(
                    f"waited at its boundary for {name}: began {begun - t0:+.1f} s, wait logged {wait[0] - t0:+.1f}, "
                    f"went on {wait[-1] - t0:+.1f}"
                )
            elif any(begun <= t <= ended for t in held):
                notes.setdefault(batch, []).append(
                    f"held {name}'s prepare off: ran {begun - t0:+.1f} s to {ended - t0:+.1f}"
                )
            else:
                notes.setdefault(batch, []).append(f"beside {name}'s start")
            if batch in timeline.checkpoint_met:
                notes[batch].append("its checkpoint met the move")
    return notes


def around(batches: dict[int, float], met: list[int], noted: set[int]) -> tuple[float, list[int]]:
    """The median of up to ``AROUND`` micro-batches on each side of those that met a move (``met``),
    leaving out batch 0 (it warms Spark up) and any batch that met or ran beside a move (``noted``)."""
    lo, hi = min(met), max(met)
    near = [b for b in batches if b > 0 and b not in noted and (lo - AROUND <= b < lo or hi < b <= hi + AROUND)]
    return (statistics.median(batches[b] for b in near) if near else float("nan")), near


def measured_before(
    log: CallLog, replicas: ReplicaSet, config: ClientConfig, plan: list[Rescale], rescales: list[dict[str, Any]]
) -> Callable[[Callable[[Any, int], None]], Callable[[Any, int], None]]:
    """Wraps the ``foreachBatch`` function as tests/support/rescale_driver.py's ``rescale_before`` does (the
    rescale of a batch runs before the batch begins, through ``MicroBatchCoordinator.rescale``), measured."""

    def wrap(run: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        def wrapped(df: Any, batch_id: int) -> None:
            for step in plan:
                if step.batch == batch_id:
                    rescales.append(
                        measure(log, replicas, step, functools.partial(ensure_layout, config, FEATURES, step))
                    )
            run(df, batch_id)

        return wrapped

    return wrap


def share_rows(rescale: dict[str, Any], urls: list[str]) -> list[list[Any]]:
    """Per replica that takes key groups: its share of the bulk job, as stored bytes of those key groups
    and as the checkpoint's bytes (each old part's bytes times the fraction of its key groups taken),
    beside what its load read."""
    rows = []
    sizes: dict[int, int] = {int(k): v for k, v in rescale["sizes"].items()}
    total_stored = sum(sizes.values()) or 1
    old = rescale["from"]
    parts = [rescale["parts"].get(url, 0) for url in urls[:old]]
    for index, url in enumerate(urls):
        groups = moving_in(old, rescale["to"], index)
        if not groups:
            continue
        stored = sum(sizes.get(g, 0) for g in groups)
        snapshot = 0.0
        for j, part in enumerate(parts):
            owned = KeyGroupRange.for_operator(MAX_PARALLELISM, old, j)
            taken = sum(1 for g in groups if owned.start <= g <= owned.end)
            snapshot += part * taken / (owned.end - owned.start + 1)
        read = rescale["loads"].get(url, {}).get("jobs", {}).get(BULK, {}).get("bytes_read")
        rows.append(
            [
                f"{old} → {rescale['to']}",
                index,
                f"{groups[0]}-{groups[-1]} ({len(groups)})",
                f"{stored / total_stored:.1%}",
                f"{stored / 1e6:,.1f}",
                f"{snapshot / 1e6:,.1f}",
                f"{read / 1e6:,.1f}" if read is not None else "-",
                f"{read / snapshot:.2f}" if read and snapshot else "-",
                f"{rescale['cpu_s'].get(url, 0):.2f}",
            ]
        )
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--batches", type=int, default=14)
    p.add_argument("--grow-at", type=int, default=5)
    p.add_argument("--shrink-at", type=int, default=10)
    p.add_argument("--events", type=int, default=200, help="events per micro-batch")
    p.add_argument("--no-spark", action="store_true", help="rescale with LiveRescale (or the CLI) alone, no query")
    p.add_argument(
        "--external",
        action="store_true",
        help="no rescale plan in the query: `statehouse rescale` runs from outside as --grow-at / --shrink-at begin",
    )
    p.add_argument(
        "--compact-moving",
        action="store_true",
        help="STATEHOUSE_RESCALE_COMPACT_MOVING=true: the move's checkpoint compacts what moves into small files",
    )
    p.add_argument("--s3-endpoint", help="use this SeaweedFS S3 (bucket 'snapshots') instead of starting one")
    p.add_argument("--json")
    return p.parse_args(argv)


def write_input(directory: Path, batches: int, events: int) -> None:
    import random

    rng = random.Random(15)
    directory.mkdir(parents=True)
    for b in range(batches):
        lines = [
            {"user_id": f"user-{rng.randrange(500)}", "item": rng.choice("abcdef"), "amount": float(rng.randrange(500))}
            for _ in range(events)
        ]
        (directory / f"events-{b:03d}.json").write_text("".join(json.dumps(e) + "\n" for e in lines))


def main(argv: list[str] | None = None, spark: Any = None) -> dict[str, Any]:
    """``spark``: a session to use (the caller's, kept running) instead of one made and stopped here."""
    cfg = parse(argv)
    who = "an operator's `statehouse rescale` from outside" if cfg.external else "the driver"
    under = "with no query" if cfg.no_spark else "under a Spark query"
    print_header(f"Live rescale 2 -> 3 -> 2 {under}, through S3 (SeaweedFS), by {who}")
    timeline = Timeline()
    load = LoadSampler()
    with contextlib.ExitStack() as stack:
        storage = s3_settings(stack, cfg.s3_endpoint, "rescale-live")
        workdir = Path(tempfile.mkdtemp(prefix="statehouse-bench-rescale-live-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        extra = {"STATEHOUSE_RESCALE_COMPACT_MOVING": "true"} if cfg.compact_moving else {}
        replicas = ReplicaSet(workdir / "replicas", storage, extra=extra)
        stack.callback(replicas.stop)
        seeds = replicas.start(2)
        new = replicas.add(2, 3, version=2)
        config = ClientConfig.of(seeds, timeout=1800.0)
        started = time.perf_counter()
        fill(config, cfg.keys)
        print(f"filled {cfg.keys:,} keys in {time.perf_counter() - started:.1f} s")

        log = CallLog()
        log.install()
        rescales: list[dict[str, Any]] = []
        plan = [Rescale(cfg.grow_at, 3, (*seeds, new.url)), Rescale(cfg.shrink_at, 2, tuple(seeds))]
        progress: list[dict[str, Any]] = []
        if cfg.no_spark and cfg.external:
            with load:
                rescales += [operator_rescale(replicas, step, workdir, load) for step in plan]
            for r in rescales:
                r["requested_as_batch"] = None
        elif cfg.no_spark:
            with load, StatehouseClient(config) as client:
                for step in plan:
                    move = LiveRescale(client, to=step.count, new_urls=list(step.urls))
                    rescales.append(measure(log, replicas, step, move.run))
                    move.close()
        else:
            # foreachBatch: timed (outermost), the driver's rescale before its batch (not --external), the batch.
            inner = (lambda run: run) if cfg.external else measured_before(log, replicas, config, plan, rescales)
            original = user_features.exactly_once
            user_features.exactly_once = lambda *a, **k: timeline.wrap(inner(original(*a, **k)))  # start() looks it up
            stack.callback(setattr, user_features, "exactly_once", original)
            watcher = CoordinatorLog(timeline)
            logging.getLogger(COORDINATOR_LOG).addHandler(watcher)
            stack.callback(logging.getLogger(COORDINATOR_LOG).removeHandler, watcher)
            write_input(workdir / "input", cfg.batches, cfg.events)
            user_features.setup(config, FEATURES)
            if spark is None:
                spark = local_spark("statehouse-bench-rescale-live")
                stack.callback(spark.stop)
            failures: list[BaseException] = []
            operator = threading.Thread(
                target=operator_moves,
                args=(plan, timeline, replicas, workdir, load, rescales, failures, query_processes(spark)),
                name="operator",
                daemon=True,
            )
            with load:
                query = user_features.start(
                    spark,
                    input_dir=str(workdir / "input"),
                    output_dir=str(workdir / "output"),
                    checkpoint_dir=str(workdir / "spark-checkpoint"),
                    config=config,
                    job=FEATURES,
                )
                if cfg.external:
                    operator.start()
                try:
                    query.awaitTermination()
                finally:
                    timeline.finish()
                    if cfg.external:
                        operator.join()
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            if failures:
                raise RuntimeError("an operator's rescale failed") from failures[0]
            if len(rescales) != len(plan):
                raise RuntimeError(f"the query ended before every move was requested ({len(rescales)} of {len(plan)})")
            progress = [p for p in query.recentProgress if p["numInputRows"]]
        urls = replicas.urls

    batches = {p["batchId"]: p["durationMs"]["triggerExecution"] / 1000 for p in progress}
    if cfg.external:
        notes = meetings(rescales, timeline)
        report_external(rescales)
    else:
        notes = {r["before_batch"]: [f"cut {r['from']} → {r['to']} (its rescale included)"] for r in rescales}
        report_driver(rescales, urls)
    result: dict[str, Any] = {"keys": cfg.keys, "external": cfg.external, "rescales": rescales, "batches_s": batches}
    if batches:
        result.update(report_batches(rescales, batches, notes, timeline, external=cfg.external))
    result["load"] = shown = load.summary()
    during = "the moves" if cfg.no_spark else "the query"
    print(f"\nload average (1 min) while {during} ran: {shown['min']:.1f}-{shown['max']:.1f}, mean {shown['mean']:.1f}")
    write_json(cfg.json, result)
    return result


def report_driver(rescales: list[dict[str, Any]], urls: list[str]) -> None:
    """The driver's (or LiveRescale's) moves: steps as its calls span them, CPU, each load's bytes."""
    print("\nRescales (wall from the request to the new layout serving; steps as the driver's calls span them):")
    rows = []
    for r in rescales:
        steps = ", ".join(f"{s} {r['steps_s'][s]:.2f}" for s in STEPS if s in r["steps_s"])
        cpu = sum(r["cpu_s"].values())
        uploaded = sum(r["uploaded"].values()) / 1e6
        rows.append(
            [
                f"{r['from']} → {r['to']}",
                f"{r['wall_s']:.2f}",
                steps,
                f"{uploaded:,.1f}",
                f"{cpu:.2f}",
                f"{r['driver_cpu_s']:.2f}",
            ]
        )
    print(table(["rescale", "wall s", "steps (s)", "checkpoint uploaded MB", "replicas' CPU s", "driver CPU s"], rows))
    print("\nBytes each replica's load read from S3 against its share of the bulk job (share: of the stored bytes;")
    print("checkpoint MB: the move's checkpoint parts' bytes times the fraction of their key groups taken):")
    share = [row for r in rescales for row in share_rows(r, urls)]
    headers = ["rescale", "replica", "key groups in", "share", "stored MB", "checkpoint MB", "read MB", "read/share"]
    print(table([*headers, "CPU s"], share))


def report_external(rescales: list[dict[str, Any]]) -> None:
    """The operator's moves: each command, its progress lines timed from the request, the steps they
    bound, the CPU of the replicas and of the command, the load while it ran."""
    print("\nRescales from outside (wall from the request, the command's start, to the new layout serving: its")
    print("`committed` line; steps as its progress lines bound them, prepare from the request):")
    rows = []
    for r in rescales:
        when = "" if r["requested_as_batch"] is None else f"   # as micro-batch {r['requested_as_batch']} began"
        print(f"\n$ {' '.join(r['command'])}{when}")
        for t, line in r["lines"]:
            print(f"  +{t:6.2f} s  {line[:160]}")
        steps = ", ".join(f"{s} {r['steps_s'][s]:.2f}" for _, s in (*CLI_STEPS, ("", "held")) if s in r["steps_s"])
        rows.append(
            [
                f"{r['from']} → {r['to']}",
                "-" if r["requested_as_batch"] is None else r["requested_as_batch"],
                f"{r['serving_s']:.2f}",
                f"{r['exit_s']:.2f}",
                f"{r['command_s']:.1f}" if r["command_s"] is not None else "-",
                steps,
                f"{sum(r['cpu_s'].values()):.2f}",
                f"{r['cli_cpu_s']:.2f}",
                " + ".join(f"{name} {cpu:.2f}" for name, cpu in r["query_cpu_s"].items()) or "-",
                f"{r['load']['min']:.1f}-{r['load']['max']:.1f}",
            ]
        )
    headers = ["rescale", "requested at batch", "to serving s", "command exit s", "command's own s", "steps (s)"]
    print()
    print(
        table(
            [*headers, "replicas' CPU s", "command CPU s", "query CPU s (JVM: its own threads)", "load (1 min)"], rows
        )
    )


def report_batches(
    rescales: list[dict[str, Any]],
    batches: dict[int, float],
    notes: dict[int, list[str]],
    timeline: Timeline,
    *,
    external: bool,
) -> dict[str, Any]:
    """Every micro-batch's duration (and the part of it in ``foreachBatch``) with its notes, and per move
    the batches that met it against the median of those around them."""
    print("\nMicro-batch durations (triggerExecution, s; in foreachBatch: from its start to its end, the rest")
    print("is Spark's planning and its own commit; times in notes are seconds from the move's request):")
    inside = {b: timeline.ended[b] - timeline.begun[b] for b in batches if b in timeline.ended and b in timeline.begun}
    shown = [
        [b, f"{s:.2f}", f"{inside[b]:.2f}" if b in inside else "-", "; ".join(notes.get(b, []))]
        for b, s in batches.items()
    ]
    print(table(["batch", "s", "in foreachBatch s", "note"], shown))
    others = [s for b, s in batches.items() if b not in notes and b > 0]  # batch 0 warms Spark up
    median = statistics.median(others) if others else float("nan")
    print(f"median of the batches that met no move (batch 0 left out: it warms Spark up): {median:.2f} s")
    rows, met_by = [], []
    for r in rescales:
        name = f"{r['from']} → {r['to']}"
        if external:
            met = sorted(
                b for b, n in notes.items() if b in batches and any(name in x and "beside" not in x for x in n)
            )
        else:
            met = [r["before_batch"]]
        near_median, near = around(batches, met or [r.get("requested_as_batch", 0)], set(notes))
        met_by.append({"rescale": name, "batches": met, "around": near, "around_median_s": near_median})
        for b in met:
            how = "; ".join(notes[b])
            rows.append(
                [
                    name,
                    b,
                    f"{batches[b]:.2f}",
                    how,
                    f"{near_median:.2f} ({', '.join(map(str, near))})",
                    f"{batches[b] - near_median:+.2f}",
                ]
            )
    print("\nThe batches that met each move against the median of those around them (up to 3 each side, none that")
    print("met or ran beside a move, not batch 0):")
    print(table(["rescale", "batch", "s", "how", "median around s (batches)", "over it s"], rows))
    return {"notes": notes, "median_other_s": median, "met": met_by, "in_foreach_batch_s": inside}


if __name__ == "__main__":
    main()
