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

A move pre-copies by default (docs/rescale.md, "Pre-copy"): prepare with ``precopy`` (nothing frozen), a
global checkpoint and a load of it on the new layout while writes go on; then the cut: prepare (the
freeze), checkpoint, load of what changed since (the old replicas' deltas), decide, commit.
``--no-precopy`` moves everything at the cut (``LiveRescale(precopy=False)``; ``--external``: the
command's ``--no-precopy``). The driver's own moves go through ``MicroBatchCoordinator.rescale``, which
takes no ``precopy``: there ``--no-precopy`` is refused.

``--writers`` (``--no-spark``): a thread updates random existing keys of the bulk job during the moves
(``columns.put`` of ``--write-batch`` random keys at a time, as fast as it can or at ``--write-rate``
rows/s) with a client following the layout (it retries 503 ``rescale_in_progress`` itself and follows
the move's 421); every request's latency is recorded, and once both moves are done every key's last
acknowledged value is read back and compared.

Reported per rescale:

- wall time from the request to the new layout serving (every replica committed), split by step
  (prepare, checkpoint, load, decide, commit) as the driver's calls span them, or, ``--external``, as the
  CLI's progress lines (stderr, timed as they arrive) bound them; with pre-copy, split into the copy
  (the first pre-copy prepare's start to the last pre-copy load's end, its own prepare, checkpoint and
  load) and the cut, and the frozen window (the first prepare of the cut's start to the last commit's
  end: writes to the moving key groups are refused); ``--external``: the copy from the request to the
  command's ``copied`` line, the frozen window from it to its ``committed`` line (an upper bound);
- per replica that takes key groups, its cut load: the entries loaded whole, the keys its deltas
  changed and the bytes it read (``--external``: its bytes and entries as the command prints them);
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
    .venv/bin/python -m bench.rescale_live --keys 1000000 --external --checkpointed  # the state checkpointed before
    .venv/bin/python -m bench.rescale_live --keys 1000000 --no-spark   # LiveRescale alone, no query
    .venv/bin/python -m bench.rescale_live --keys 1000000 --no-spark --writers [--no-precopy]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import math
import os
import random
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

from bench.common import print_header, process_cpu_ns, s3_settings, table, write_json
from docs.examples import user_features
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.global_checkpoints import CheckpointCoordinator
from statehouse.client.rescale import CATCH_UP_ROUNDS, LiveRescale
from statehouse.client.transport import ReplicaConnection
from statehouse.protocol.keygroups import KeyGroupRange
from tests.support.replica_set import ReplicaSet
from tests.support.rescale_driver import Rescale, ensure_layout
from tests.support.spark import local_spark

BULK = "bulk"
FEATURES = "features"
MAX_PARALLELISM = 128
STEPS = ("prepare", "checkpoint", "load", "decide", "commit")
PREPARE, LOAD, COMMIT = "/v1/topology/prepare", "/v1/topology/load", "/v1/topology/commit"
STATEHOUSE = str(Path(sys.executable).parent / "statehouse")  # the command, as installed beside this Python
# The CLI's progress lines (client/cli/rescale.py, on stderr) that end each step of a move, in order.
# With pre-copy, "copying" ends the copy's prepare (from the request) and "copied" its checkpoint and load.
CLI_STEPS = (
    ("copying", "copy prepare"),
    ("copied", "copy"),
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
WRITERS_ALONE = 3.0  # seconds the writers run before, between and after the moves: their latency with no move


@dataclass
class Call:
    url: str
    path: str
    body: Any
    started: float  # time.monotonic()
    ended: float
    answer: Any

    @property
    def precopy(self) -> bool:
        """A pre-copy's prepare or load (its body says ``precopy``)."""
        return isinstance(self.body, dict) and bool(self.body.get("precopy"))


@dataclass
class CallLog:
    """The driver's POSTs of a rescale's steps while it runs, with their bodies (this process's client
    calls, wrapped: no product hook). A call is of the copy phase when its body says ``precopy`` (the
    copy's prepare and load) or it is a checkpoint call between the first pre-copy prepare's start and
    the last pre-copy load's end; every other one is of the cut."""

    calls: list[Call] = field(default_factory=list)
    recording: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self) -> None:
        original = ReplicaConnection.json

        def json_call(conn: ReplicaConnection, method: str, path: str, body: Any = None, *, idempotent: bool = True):
            started = time.monotonic()
            answer = original(conn, method, path, body, idempotent=idempotent)
            if self.recording and method == "POST" and step_of(path) is not None:
                with self.lock:
                    self.calls.append(Call(conn.url.rstrip("/"), path, body, started, time.monotonic(), answer))
            return answer

        ReplicaConnection.json = json_call  # type: ignore[method-assign,assignment]

    def copy_window(self) -> tuple[float, float] | None:
        """The copy: the first pre-copy prepare's start to the last pre-copy load's end (None: no pre-copy)."""
        copied = [c for c in self.calls if c.precopy]
        if not copied:
            return None
        loads = [c.ended for c in copied if c.path == LOAD] or [c.ended for c in copied]
        return min(c.started for c in copied if c.path == PREPARE), max(loads)

    def frozen_window(self) -> tuple[float, float] | None:
        """The cut's freeze: the first prepare without ``precopy``'s start to the last commit's end."""
        prepares = [c.started for c in self.calls if c.path == PREPARE and not c.precopy]
        commits = [c.ended for c in self.calls if c.path == COMMIT]
        return (min(prepares), max(commits)) if prepares and commits else None

    def phase(self, call: Call) -> str:
        window = self.copy_window()
        if call.precopy or step_of(call.path) == "catch-up":  # a catch-up round is of the copy
            return "copy"
        inside = window is not None and window[0] <= call.started and call.ended <= window[1]
        return "copy" if inside and step_of(call.path) == "checkpoint" else "cut"

    def steps(self, phase: str = "cut") -> dict[str, float]:
        """Seconds from the first to the last call of each step of ``phase`` ("copy" or "cut")."""
        spans: dict[str, list[float]] = {}
        for call in self.calls:
            step = step_of(call.path)
            if step is not None and self.phase(call) == phase:
                spans.setdefault(step, []).extend((call.started, call.ended))
        return {step: max(s) - min(s) for step, s in spans.items()}

    def loads(self, phase: str = "cut") -> dict[str, dict[str, Any]]:
        """Each replica's answer to its (last) load of ``phase``; a catch-up's apply is not one."""
        return {
            c.url: c.answer
            for c in self.calls
            if c.path == LOAD and self.phase(c) == phase and not (isinstance(c.body, dict) and c.body.get("catch_up"))
        }

    def parts(self, job: str, *, uploaded_only: bool = False, phase: str = "cut") -> dict[str, int]:
        """The bytes of each replica's part of the ``phase`` checkpoint of ``job`` (uploaded + reused), or
        (``uploaded_only``) what that checkpoint uploaded: its cost on the old replicas."""
        done = [
            c
            for c in self.calls
            if c.path.startswith(f"/v1/jobs/{job}/checkpoints/") and c.path.endswith("/complete")
            if self.phase(c) == phase
        ]
        reused = 0 if uploaded_only else 1
        return {c.url: c.answer.get("bytes_uploaded", 0) + reused * c.answer.get("bytes_reused", 0) for c in done}


def step_of(path: str) -> str | None:
    if path.startswith("/v1/topology/"):
        return path.rsplit("/", 1)[1]
    if "/checkpoints" in path:
        return "checkpoint"
    return None


def fill(
    config: ClientConfig,
    count: int,
    chunk: int = 20_000,
    *,
    jobs: int = 0,
    job_keys: int = 0,
    checkpointed: bool = False,
) -> None:
    """``count`` keys of 100 random bytes (base64 text: the same value travels as JSON and msgpack)
    in the bulk job; ``jobs`` more jobs (``more-0``...) of ``job_keys`` keys each beside it.
    ``checkpointed``: each job then takes a global checkpoint, as a job checkpointed on a schedule
    has one before a move (whose checkpoint then uploads only the files made since)."""
    import base64

    with StatehouseClient(config) as client:
        for name, keys_in in [(BULK, count), *((f"more-{j}", job_keys) for j in range(jobs))]:
            job = client.create_job(name, MAX_PARALLELISM)
            job.register("v", "value")
            columns = job.columns()
            for start in range(0, keys_in, chunk):
                keys = [f"k{i:015d}" for i in range(start, min(keys_in, start + chunk))]
                values = [base64.b64encode(os.urandom(75)).decode() for _ in keys]
                columns.put("v", keys, values)
            if checkpointed:
                CheckpointCoordinator(job).checkpoint()


def fill_query_state(config: ClientConfig, users: int, chunk: int = 20_000) -> None:
    """The query's own job holds ``users`` users the input never names (their total, average and
    one item count each) before it starts: its every checkpoint carries them, as a long-running
    query's state does, and a move's new replicas checkpoint what they took at the query's next."""
    with StatehouseClient(config) as client:
        columns = client.job(FEATURES).columns()
        for start in range(0, users, chunk):
            keys = [f"known-{i:09d}" for i in range(start, min(users, start + chunk))]
            amounts = [float(i % 997) for i in range(start, start + len(keys))]
            columns.add_states({"total_spent": amounts, "avg_amount": amounts}, keys)
            columns.map_add("item_counts", keys, ["book"] * len(keys), [1] * len(keys))


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
    """Run ``rescale`` (one rescale to ``step.count``) and measure it: wall from the request to its
    return (after every commit and the verification) and to the new layout serving (the last commit's
    answer), the copy and the frozen window, the steps' spans in each phase, each load's answer, the
    stored bytes per key group before it, and the CPU of every replica and of this process."""
    old = 2 if step.count == 3 else 3
    sizes = stored_bytes(replicas.urls[:old])
    pids = {s.url: s.process.pid for s in replicas.servers}
    cpu = {url: process_cpu_ns(pid) for url, pid in pids.items()}
    own_cpu = time.process_time()
    log.calls.clear()
    log.recording = True
    started = time.monotonic()
    try:
        rescale()
    finally:
        ended = time.monotonic()
        log.recording = False
    copy, frozen = log.copy_window(), log.frozen_window()
    return {
        "before_batch": step.batch,
        "from": old,
        "to": step.count,
        "precopy": copy is not None,
        "t0": started,
        "wall_s": ended - started,
        "serving_s": (frozen[1] if frozen else ended) - started,
        "copy_at": [copy[0] - started, copy[1] - started] if copy else None,  # seconds from the request
        "frozen_at": [frozen[0] - started, frozen[1] - started] if frozen else None,
        "copy_s": copy[1] - copy[0] if copy else None,
        "frozen_s": frozen[1] - frozen[0] if frozen else None,
        "steps_s": log.steps("cut"),
        "copy_steps_s": log.steps("copy"),
        "loads": log.loads("cut"),
        "copy_loads": log.loads("copy"),
        "parts": log.parts(BULK),
        "uploaded": log.parts(BULK, uploaded_only=True),
        "copy_uploaded": log.parts(BULK, uploaded_only=True, phase="copy"),
        "sizes": sizes,
        "cpu_s": {url: (process_cpu_ns(pid) - cpu[url]) / 1e9 for url, pid in pids.items()},
        "driver_cpu_s": time.process_time() - own_cpu,
    }


@dataclass
class Write:
    started: float  # time.monotonic()
    ended: float
    rows: int
    ok: bool


class Writers:
    """A thread updating random existing keys of the bulk job (``columns.put`` of ``batch`` distinct
    random keys per request, as fast as it can or at ``rate`` rows/s) with its own client, which
    follows the layout (it retries 503 ``rescale_in_progress`` itself, obeying ``Retry-After``, and
    reroutes on the move's 421). Every request is timed; the last acknowledged value of every key is
    kept, to be read back with :meth:`check`. A request that fails leaves its keys' values unknown:
    they are counted and left out of the check."""

    def __init__(self, config: ClientConfig, keys: int, batch: int = 500, rate: float | None = None) -> None:
        self.config, self.keys, self.batch, self.rate = config, keys, batch, rate
        self.writes: list[Write] = []
        self.acked: dict[str, str] = {}
        self.unknown: set[str] = set()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)

    def _run(self) -> None:
        import base64

        rng = random.Random(44)
        with StatehouseClient(self.config) as client:
            columns = client.job(BULK).columns()
            begun = time.monotonic()
            sent = 0
            while not self._stop.is_set():
                keys = [f"k{i:015d}" for i in rng.sample(range(self.keys), self.batch)]
                values = [base64.b64encode(os.urandom(75)).decode() for _ in keys]
                started = time.monotonic()
                try:
                    columns.put("v", keys, values)
                except Exception as exc:  # counted, reported; its keys are left out of the check
                    self.writes.append(Write(started, time.monotonic(), len(keys), False))
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    for key in keys:
                        self.acked.pop(key, None)
                    self.unknown.update(keys)
                    continue
                self.writes.append(Write(started, time.monotonic(), len(keys), True))
                self.acked.update(zip(keys, values, strict=True))
                self.unknown.difference_update(keys)
                sent += len(keys)
                if self.rate:
                    ahead = begun + sent / self.rate - time.monotonic()
                    if ahead > 0:
                        self._stop.wait(ahead)

    def __enter__(self) -> Writers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def during(self, start: float, end: float) -> dict[str, Any]:
        """The requests begun from ``start`` to ``end``: their count, the rows acknowledged, the failed
        ones, the latency percentiles and the longest (with when it began, seconds from ``start``)."""
        inside = [w for w in self.writes if start <= w.started <= end]
        latencies = sorted(w.ended - w.started for w in inside)
        longest = max(inside, key=lambda w: w.ended - w.started, default=None)
        return {
            "requests": len(inside),
            "rows": sum(w.rows for w in inside if w.ok),
            "failed": sum(1 for w in inside if not w.ok),
            "p50_s": percentile(latencies, 0.50),
            "p99_s": percentile(latencies, 0.99),
            "max_s": latencies[-1] if latencies else None,
            "longest_began_s": longest.started - start if longest else None,
        }

    def check(self, config: ClientConfig, chunk: int = 10_000) -> int:
        """Read every key's last acknowledged value back (the layout now serving) and assert it;
        the number of keys checked."""
        keys = sorted(self.acked)
        with StatehouseClient(config) as client:
            columns = client.job(BULK).columns()
            for start in range(0, len(keys), chunk):
                some = keys[start : start + chunk]
                got = columns.get("v", some, as_arrow=True).to_pylist()
                wrong = [(k, v) for k, v in zip(some, got, strict=True) if v != self.acked[k]]
                if wrong:
                    key, value = wrong[0]
                    raise AssertionError(
                        f"{len(wrong)} of {len(some)} keys read back differ from their last acknowledged write, "
                        f"e.g. {key}: {str(value)[:20]!r}, not {self.acked[key][:20]!r}"
                    )
        return len(keys)


def ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:,.0f}" if seconds is not None else "-"


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``sorted_values`` (nearest rank), or None when there are none."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values), max(1, math.ceil(q * len(sorted_values)))) - 1]


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
    replicas: ReplicaSet,
    step: Rescale,
    workdir: Path,
    load: LoadSampler,
    query: dict[str, int] | None = None,
    *,
    precopy: bool = True,
) -> dict[str, Any]:
    """Run ``statehouse rescale --to M`` from outside, as an operator does (the command as a subprocess,
    its defaults but ``--no-precopy`` when not ``precopy``, no STATEHOUSE_* environment), and time it:
    from the request (the command's start) to each progress line on its stderr, to the copy's end (its
    ``copied`` line), to the new layout serving (its ``committed`` line: every replica committed) and
    to its exit; the bytes each copy and cut load read and the entries of each cut load, as it prints
    them; beside it the CPU of every replica, of the command and of the query's processes (``query``:
    name -> pid)."""
    old = 2 if step.count == 3 else 3
    urls = replicas.urls[:old]
    added = [url for url in step.urls if url not in urls]
    command = [STATEHOUSE, "rescale", "--to", str(step.count), "--urls", ",".join(urls)]
    command += ["--urls-new", ",".join(added)] if added else []
    command += [] if precopy else ["--no-precopy"]
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
    copied = at.get("copied")
    return {
        "requested_as_batch": step.batch,
        "from": old,
        "to": step.count,
        "precopy": copied is not None,
        "command": ["statehouse", *command[1:]],
        "t0": started,
        "serving_s": at["committed"],
        "copy_s": copied,  # from the request (the command's start) to its `copied` line
        "frozen_s": at["committed"] - (copied or 0.0),  # `copied` (or the request) to `committed`: an upper bound
        "copy_read": line_bytes(lines, "copied"),
        "cut_read": line_bytes(lines, "loaded"),
        "cut_entries": {
            url: int(n) for url, _, n in re.findall(r"^\s*(\S+): loaded (\d+) bytes, (\d+) entries", text, re.M)
        },
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


def line_bytes(lines: list[tuple[float, str]], word: str) -> dict[str, int]:
    """The bytes per replica URL of the command's ``copied:`` or ``loaded:`` line (``URL N bytes, ...``)."""
    line = next((line for _, line in lines if line.startswith(f"{word}: ")), "")
    return {url: int(n) for url, n in re.findall(r"(\S+) (\d+) bytes", line.split(": ", 1)[-1])}


def cli_steps(lines: list[tuple[float, str]]) -> tuple[dict[str, float], dict[str, float]]:
    """Each step's seconds as the CLI's progress lines bound it (the first: from the request, so the
    command's start and its checks; ``copy prepare``, ``copy``: the pre-copy's prepare, and its checkpoint
    and load; ``prepare`` includes any wait for a batch in flight; each step from the line before;
    ``held``: from its first wait for a micro-batch to end to its prepare), and when each line first
    came, from the request."""
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
    precopy: bool = True,
) -> None:
    """The operator: each move of ``plan`` is requested as its micro-batch begins (a thread's body)."""
    try:
        for step in plan:
            if not timeline.await_begun(step.batch):
                return
            rescales.append(operator_rescale(replicas, step, workdir, load, query, precopy=precopy))
    except BaseException as exc:  # reported by the main thread once the query ended
        failures.append(exc)


def meetings(rescales: list[dict[str, Any]], timeline: Timeline) -> dict[int, list[str]]:
    """How each micro-batch met each external move, if it did, with when (seconds from the move's
    request): ``held`` (in flight when the move's prepare was refused: the command waited for it to
    end), ``waited`` (it began during the move and waited at its boundary: when its ``foreachBatch``
    began, when the coordinator logged the wait and when it logged going on), ``checkpoint met`` (its
    checkpoint met the move and was taken again), ``beside`` (it ran while the command started, before
    any prepare, and met nothing but the command's start; with pre-copy: it ran during the copy and
    ended before the command's ``copied`` line), ``from the copy into its cut`` (it began during the copy
    and ended after ``copied``: it ran into the cut's prepare and the frozen window)."""
    notes: dict[int, list[str]] = {}
    for r in rescales:
        t0, end = r["t0"], r["t0"] + r["serving_s"]
        name = f"{r['from']} → {r['to']}"
        copied = r.get("copy_s")
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
            elif copied is not None and ended > t0 + copied:
                notes.setdefault(batch, []).append(
                    f"ran from {name}'s copy into its cut: {begun - t0:+.1f} s to {ended - t0:+.1f} (copied "
                    f"{copied:+.1f})"
                )
            elif copied is not None:
                notes.setdefault(batch, []).append(
                    f"beside {name}'s copy: ran {begun - t0:+.1f} s to {ended - t0:+.1f} (copied {copied:+.1f})"
                )
            else:
                notes.setdefault(batch, []).append(f"beside {name}'s start")
            if batch in timeline.checkpoint_met:
                notes[batch].append("its checkpoint met the move")
    return notes


def around(batches: dict[int, float], met: list[int], noted: set[int]) -> tuple[float, list[int]]:
    """The median of the ``AROUND`` nearest micro-batches on each side of those that met a move
    (``met``), leaving out batch 0 (it warms Spark up) and any batch that met or ran beside a move
    (``noted``: with pre-copy, those that ran during a copy)."""
    lo, hi = min(met), max(met)
    usual = [b for b in sorted(batches) if b > 0 and b not in noted]
    near = sorted([b for b in usual if b < lo][-AROUND:] + [b for b in usual if b > hi][:AROUND])
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
    beside what its bulk load read (the copy's with pre-copy, else the cut's)."""
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
        bulk = rescale["copy_loads"] if rescale.get("precopy") else rescale["loads"]
        read = bulk.get(url, {}).get("jobs", {}).get(BULK, {}).get("bytes_read")
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
    p.add_argument("--backend", choices=("rocksdb", "heap"), default="rocksdb", help="the replicas' backend")
    p.add_argument(
        "--compact-moving",
        action="store_true",
        help="STATEHOUSE_RESCALE_COMPACT_MOVING=true: the move's checkpoint compacts what moves into small files",
    )
    p.add_argument(
        "--no-precopy",
        dest="precopy",
        action="store_false",
        help="move everything at the cut (LiveRescale(precopy=False); --external: the command's --no-precopy); not "
        "with the driver's own moves (MicroBatchCoordinator.rescale takes no precopy)",
    )
    p.add_argument(
        "--writers",
        action="store_true",
        help="--no-spark: a thread updates random existing keys during the moves; latencies, then every key checked",
    )
    p.add_argument(
        "--catch-up-rounds",
        type=int,
        default=CATCH_UP_ROUNDS,
        help="--no-spark: LiveRescale's catch-up rounds of the pre-copy (0: none, the cut carries all the copy missed)",
    )
    p.add_argument(
        "--checkpointed",
        action="store_true",
        help="each job takes a checkpoint after the fill (untimed), as a job checkpointed on a schedule has one "
        "before a move: the move's checkpoints then upload only the files made since",
    )
    p.add_argument(
        "--query-users",
        type=int,
        default=0,
        help="the query's own job filled with this many users first (untimed): its checkpoints carry them, and "
        "after a move the new layout's first checkpoint of the query uploads what the new replicas took",
    )
    p.add_argument("--jobs", type=int, default=0, help="more jobs beside the bulk one (a set of many jobs)")
    p.add_argument("--job-keys", type=int, default=20_000, help="--jobs: keys in each")
    p.add_argument("--write-batch", type=int, default=500, help="--writers: random keys per columns.put")
    p.add_argument("--write-rate", type=float, help="--writers: rows/s (default: as fast as it can)")
    p.add_argument("--s3-endpoint", help="use this SeaweedFS S3 (bucket 'snapshots') instead of starting one")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if not args.precopy and not (args.no_spark or args.external):
        p.error(
            "--no-precopy needs --no-spark or --external: the driver's moves go through "
            "MicroBatchCoordinator.rescale, which takes no precopy"
        )
    if args.writers and not args.no_spark:
        p.error("--writers needs --no-spark")
    return args


def keep_logs(workdir: Path, failed: type[BaseException] | None, *exc: object) -> bool:
    """On a failure, the replicas' logs (their problems' request ids) are copied out of ``workdir``
    before it is removed, and where to is printed."""
    if failed is not None:
        kept = Path(tempfile.mkdtemp(prefix="statehouse-bench-rescale-live-logs-"))
        for log in (workdir / "replicas").rglob("*.log"):
            shutil.copy(log, kept / f"{log.parent.name}-{log.name}")
        print(f"the replicas' logs are kept in {kept}", file=sys.stderr)
    return False


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
    print_header(f"Live rescale 2 -> 3 -> 2 {under}, through S3 (SeaweedFS), by {who}, {cfg.backend} backend")
    timeline = Timeline()
    load = LoadSampler()
    with contextlib.ExitStack() as stack:
        storage = s3_settings(stack, cfg.s3_endpoint, "rescale-live")
        workdir = Path(tempfile.mkdtemp(prefix="statehouse-bench-rescale-live-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        stack.push(functools.partial(keep_logs, workdir))  # runs before the rmtree
        extra = {"STATEHOUSE_RESCALE_COMPACT_MOVING": "true"} if cfg.compact_moving else {}
        replicas = ReplicaSet(workdir / "replicas", storage, extra=extra, backend=cfg.backend)
        stack.callback(replicas.stop)
        seeds = replicas.start(2)
        new = replicas.add(2, 3, version=2)
        config = ClientConfig.of(seeds, timeout=1800.0)
        started = time.perf_counter()
        fill(config, cfg.keys, jobs=cfg.jobs, job_keys=cfg.job_keys, checkpointed=cfg.checkpointed)
        more = f" and {cfg.jobs} more jobs of {cfg.job_keys:,}" if cfg.jobs else ""
        then = ", then checkpointed" if cfg.checkpointed else ""
        print(f"filled {cfg.keys:,} keys{more}{then} in {time.perf_counter() - started:.1f} s")

        log = CallLog()
        log.install()
        rescales: list[dict[str, Any]] = []
        plan = [Rescale(cfg.grow_at, 3, (*seeds, new.url)), Rescale(cfg.shrink_at, 2, tuple(seeds))]
        progress: list[dict[str, Any]] = []
        writers = Writers(config, cfg.keys, cfg.write_batch, cfg.write_rate) if cfg.writers else None
        if cfg.no_spark:
            with load, writers or contextlib.nullcontext():
                time.sleep(WRITERS_ALONE if writers else 0)  # the writers' latency with no move, to compare
                if cfg.external:
                    for step in plan:
                        rescales.append(operator_rescale(replicas, step, workdir, load, precopy=cfg.precopy))
                        rescales[-1]["requested_as_batch"] = None
                        time.sleep(WRITERS_ALONE if writers else 0)
                else:
                    with StatehouseClient(config) as client:
                        for step in plan:
                            with LiveRescale(
                                client,
                                to=step.count,
                                new_urls=list(step.urls),
                                precopy=cfg.precopy,
                                catch_up_rounds=cfg.catch_up_rounds,
                            ) as m:
                                rescales.append(measure(log, replicas, step, m.run))
                            time.sleep(WRITERS_ALONE if writers else 0)
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
            if cfg.query_users:
                started = time.perf_counter()
                fill_query_state(config, cfg.query_users)
                print(f"filled the query's job with {cfg.query_users:,} users in {time.perf_counter() - started:.1f} s")
            if spark is None:
                spark = local_spark("statehouse-bench-rescale-live")
                stack.callback(spark.stop)
            # Spark keeps a query's last 100 progress reports: every batch's duration is reported here.
            spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(cfg.batches + 10))
            failures: list[BaseException] = []
            operator = threading.Thread(
                target=operator_moves,
                args=(plan, timeline, replicas, workdir, load, rescales, failures, query_processes(spark), cfg.precopy),
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

        checked = writers.check(config) if writers else None  # the layout now serving: 2 replicas again

    batches = {p["batchId"]: p["durationMs"]["triggerExecution"] / 1000 for p in progress}
    if cfg.external:
        notes = meetings(rescales, timeline)
        report_external(rescales)
    else:
        notes = {r["before_batch"]: [f"cut {r['from']} → {r['to']} (its rescale included)"] for r in rescales}
        report_driver(rescales, urls)
    result: dict[str, Any] = {
        "keys": cfg.keys,
        "external": cfg.external,
        "precopy": cfg.precopy,
        "rescales": rescales,
        "batches_s": batches,
    }
    if writers is not None:
        result["writers"] = report_writers(writers, rescales, checked)
    if batches:
        result.update(report_batches(rescales, batches, notes, timeline, external=cfg.external))
    result["load"] = shown = load.summary()
    during = "the moves" if cfg.no_spark else "the query"
    print(f"\nload average (1 min) while {during} ran: {shown['min']:.1f}-{shown['max']:.1f}, mean {shown['mean']:.1f}")
    write_json(cfg.json, result)
    return result


def report_driver(rescales: list[dict[str, Any]], urls: list[str]) -> None:
    """The driver's (or LiveRescale's) moves: the copy and the frozen window, the steps of each phase as
    its calls span them, CPU, each load's bytes, the cut loads' entries and delta keys."""
    print("\nRescales (to serving: from the request to the last commit's answer; wall: to the call's return, after")
    print("the verification; copy: first pre-copy prepare's start to last pre-copy load's end; frozen: first prepare")
    print("of the cut's start to last commit's end; steps as the driver's calls span them):")
    rows = []
    for r in rescales:
        copy_steps = ", ".join(f"{s} {r['copy_steps_s'][s]:.2f}" for s in STEPS if s in r["copy_steps_s"]) or "-"
        steps = ", ".join(f"{s} {r['steps_s'][s]:.2f}" for s in STEPS if s in r["steps_s"])
        cpu = sum(r["cpu_s"].values())
        uploaded = sum(r["uploaded"].values()) / 1e6
        copy_uploaded = sum(r["copy_uploaded"].values()) / 1e6
        rows.append(
            [
                f"{r['from']} → {r['to']}",
                "yes" if r["precopy"] else "no",
                f"{r['serving_s']:.2f}",
                f"{r['wall_s']:.2f}",
                f"{r['copy_s']:.2f}" if r["copy_s"] is not None else "-",
                f"{r['frozen_s']:.2f}" if r["frozen_s"] is not None else "-",
                copy_steps,
                steps,
                f"{copy_uploaded:,.1f} + {uploaded:,.1f}" if r["precopy"] else f"{uploaded:,.1f}",
                f"{cpu:.2f}",
                f"{r['driver_cpu_s']:.2f}",
            ]
        )
    headers = ["rescale", "pre-copy", "to serving s", "wall s", "copy s", "frozen s", "copy steps (s)", "cut steps (s)"]
    print(table([*headers, "checkpoint uploaded MB (copy + cut)", "replicas' CPU s", "driver CPU s"], rows))
    print("\nBytes each replica's bulk load (the copy's, or the cut's without pre-copy) read from S3 against its share")
    print("of the bulk job (share: of the stored bytes; checkpoint MB: the move's checkpoint parts' bytes times the")
    print("fraction of their key groups taken):")
    share = [row for r in rescales for row in share_rows(r, urls)]
    headers = ["rescale", "replica", "key groups in", "share", "stored MB", "checkpoint MB", "read MB", "read/share"]
    print(table([*headers, "CPU s"], share))
    print("\nEach replica's loads of the bulk job: the copy's, and the cut's (entries: loaded whole; delta keys: the")
    print("keys the old replicas' deltas changed; delta key groups: those brought up to the cut by a delta):")
    print(table(LOAD_HEADERS, [row for r in rescales for row in load_rows(r, urls)]))


LOAD_HEADERS = [
    "rescale",
    "replica",
    "copy entries",
    "copy read MB",
    "cut entries (whole)",
    "cut delta keys",
    "cut delta key groups",
    "cut read MB",
]


def load_rows(rescale: dict[str, Any], urls: list[str]) -> list[list[Any]]:
    """Per replica that takes key groups: its copy load's and its cut load's answer for the bulk job."""
    rows = []
    for index, url in enumerate(urls):
        if not moving_in(rescale["from"], rescale["to"], index):
            continue
        copy = rescale["copy_loads"].get(url, {}).get("jobs", {}).get(BULK)
        cut = rescale["loads"].get(url, {}).get("jobs", {}).get(BULK) or {}
        spans = " ".join(f"{g[0]}-{g[1]}" for g in cut.get("delta_key_groups", [])) or "-"
        rows.append(
            [
                f"{rescale['from']} → {rescale['to']}",
                index,
                f"{copy['entries']:,}" if copy else "-",
                f"{copy['bytes_read'] / 1e6:,.1f}" if copy else "-",
                f"{cut.get('entries', 0):,}",
                f"{cut.get('delta_keys', 0):,}",
                spans,
                f"{cut.get('bytes_read', 0) / 1e6:,.1f}",
            ]
        )
    return rows


def report_writers(writers: Writers, rescales: list[dict[str, Any]], checked: int | None) -> dict[str, Any]:
    """The writers' requests during each move (begun from its request to the new layout serving), during
    its copy and its frozen window, and with no move (begun outside every move), and the check."""
    print(f"\nWriters: columns.put of {writers.batch} random existing keys per request, ", end="")
    print(f"{'as fast as it can' if not writers.rate else f'{writers.rate:,.0f} rows/s'} (latency of each call, its")
    print("client's retries of 503 rescale_in_progress included; the longest: when it began, from its span's start):")
    moves = [(r["t0"], r["t0"] + r["serving_s"]) for r in rescales]
    rows, found = [], {}

    def row(name: str, shown: dict[str, Any], span: float | None) -> None:
        found[name] = shown
        rows.append(
            [
                name,
                f"{span:.2f}" if span is not None else "-",
                shown["requests"],
                f"{shown['rows']:,}",
                shown["failed"],
                ms(shown["p50_s"]),
                ms(shown["p99_s"]),
                f"{shown['max_s']:.2f}" if shown["max_s"] is not None else "-",
                f"{shown['longest_began_s']:+.2f}" if shown["longest_began_s"] is not None else "-",
            ]
        )

    for r, (start, end) in zip(rescales, moves, strict=True):
        name = f"{r['from']} → {r['to']}"
        row(f"{name}: the move", writers.during(start, end), end - start)
        if r.get("copy_at"):
            copy_start, copy_end = (start + t for t in r["copy_at"])
            row(f"{name}: its copy", writers.during(copy_start, copy_end), copy_end - copy_start)
        if r.get("frozen_at"):
            frozen_start, frozen_end = (start + t for t in r["frozen_at"])
            row(f"{name}: frozen window", writers.during(frozen_start, frozen_end), frozen_end - frozen_start)
    alone = [w for w in writers.writes if not any(a <= w.started <= b for a, b in moves)]
    latencies = sorted(w.ended - w.started for w in alone)
    row(
        "no move",
        {
            "requests": len(alone),
            "rows": sum(w.rows for w in alone if w.ok),
            "failed": sum(1 for w in alone if not w.ok),
            "p50_s": percentile(latencies, 0.5),
            "p99_s": percentile(latencies, 0.99),
            "max_s": latencies[-1] if latencies else None,
            "longest_began_s": None,
        },
        None,
    )
    headers = ["writes begun during", "span s", "requests", "rows acked", "failed", "p50 ms", "p99 ms", "longest s"]
    print(table([*headers, "longest began s"], rows))
    for error in writers.errors[:5]:
        print(f"writer error: {error[:300]}")
    print(
        f"checked: {checked:,} keys read back equal to their last acknowledged write "
        f"({len(writers.unknown):,} left out: their last write failed)"
    )
    return {"during": found, "checked": checked, "errors": writers.errors, "unknown": len(writers.unknown)}


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
                f"{r['copy_s']:.2f}" if r["copy_s"] is not None else "-",
                f"{r['frozen_s']:.2f}",
                f"{r['exit_s']:.2f}",
                f"{r['command_s']:.1f}" if r["command_s"] is not None else "-",
                steps,
                f"{sum(r['cpu_s'].values()):.2f}",
                f"{r['cli_cpu_s']:.2f}",
                " + ".join(f"{name} {cpu:.2f}" for name, cpu in r["query_cpu_s"].items()) or "-",
                f"{r['load']['min']:.1f}-{r['load']['max']:.1f}",
            ]
        )
    headers = ["rescale", "requested at batch", "to serving s", "copy s", "frozen s (≤)", "command exit s"]
    print("\n(copy: from the request to the `copied` line; frozen: from `copied`, or without pre-copy from the")
    print("request, to `committed`, an upper bound)")
    print(
        table(
            [
                *headers,
                "command's own s",
                "steps (s)",
                "replicas' CPU s",
                "command CPU s",
                "query CPU s (JVM: its own threads)",
                "load (1 min)",
            ],
            rows,
        )
    )
    print("\nEach replica's loads as the command printed them (copy: its `copied` line; cut: its `loaded` line and")
    print("its report's entries, loaded whole; delta keys are not printed by the command):")
    loads = []
    for r in rescales:
        for url in sorted(set(r["copy_read"]) | set(r["cut_read"])):
            copy = r["copy_read"].get(url)
            loads.append(
                [
                    f"{r['from']} → {r['to']}",
                    url,
                    f"{copy / 1e6:,.1f}" if copy is not None else "-",
                    f"{r['cut_entries'].get(url, 0):,}",
                    f"{r['cut_read'].get(url, 0) / 1e6:,.1f}",
                ]
            )
    print(table(["rescale", "replica", "copy read MB", "cut entries (whole)", "cut read MB"], loads))


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
    print("\nThe batches that met each move against the median of those around them (the 3 nearest on each side")
    print("that met no move and ran beside none, its copy included; not batch 0):")
    print(table(["rescale", "batch", "s", "how", "median around s (batches)", "over it s"], rows))
    return {"notes": notes, "median_other_s": median, "met": met_by, "in_foreach_batch_s": inside}


if __name__ == "__main__":
    main()
