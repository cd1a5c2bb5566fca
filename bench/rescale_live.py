"""Benchmark 15: live rescale 2 -> 3 -> 2 under a running Spark query, state moved through SeaweedFS S3.

Two RocksDB replicas hold a job of ``--keys`` keys (16-byte keys, 100 random bytes each, 128 key groups)
and the user-features job of a Spark streaming query (``--batches`` micro-batches, one file each); every
checkpoint goes to S3. A third replica starts empty. The query's driver rescales the set to 3 replicas
before micro-batch ``--grow-at`` and back to 2 before ``--shrink-at`` (``MicroBatchCoordinator.rescale``,
through harness/rescale_driver.py's wrapper, as the live-rescale test does). Reported per rescale:

- wall time from the request to the new layout serving (the rescale call returns after every commit),
  split by step (prepare, checkpoint, load, decide, commit, and the batch anchor's carry-over to the new
  layout) as the driver's calls span them;
- per replica that takes key groups: the bytes its load read from S3 against its share, the stored bytes
  of the key groups it takes (``GET .../sizes`` before the move) and the checkpoint's bytes scaled to
  those key groups;
- CPU seconds of each replica process and of this (driver) process during the rescale, beside the wall;
- every micro-batch's duration (Spark's triggerExecution): the batch that crosses the cut against the
  batches around it.

The machine is shared (other sessions' tests run beside it): figures of one run spread widely.

    .venv/bin/python -m bench.rescale_live --keys 1000000
    .venv/bin/python -m bench.rescale_live --keys 1000000 --no-spark   # LiveRescale alone, no query
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
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
from harness.replica_set import ReplicaSet
from harness.rescale_driver import Rescale, ensure_layout
from harness.spark import local_spark
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.rescale import LiveRescale
from statehouse.client.transport import ReplicaConnection
from statehouse.keygroups import KeyGroupRange
from statehouse.pipelines import user_features

BULK = "bulk"
FEATURES = "features"
MAX_PARALLELISM = 128
STEPS = ("prepare", "checkpoint", "load", "decide", "commit", "carry-over")


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
        """Seconds from the first to the last call of each step. Checkpoint calls after the commits are
        the batch anchor's carry-over to the new layout (MicroBatchCoordinator.rescale), not the move's."""
        commits = [c.ended for c in self.calls if c.path == "/v1/topology/commit"]
        spans: dict[str, list[float]] = {}
        for call in self.calls:
            step = step_of(call.path)
            if step == "checkpoint" and commits and call.started >= max(commits):
                step = "carry-over"
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


def measured_before(
    log: CallLog, replicas: ReplicaSet, config: ClientConfig, plan: list[Rescale], rescales: list[dict[str, Any]]
) -> Callable[[Callable[[Any, int], None]], Callable[[Any, int], None]]:
    """Wraps the ``foreachBatch`` function as harness/rescale_driver.py's ``rescale_before`` does (the
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
    p.add_argument("--no-spark", action="store_true", help="rescale with LiveRescale alone, no query")
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
    print_header("Live rescale 2 -> 3 -> 2 under a Spark query, through S3 (SeaweedFS)")
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
        if cfg.no_spark:
            with StatehouseClient(config) as client:
                for step in plan:
                    move = LiveRescale(client, to=step.count, new_urls=list(step.urls))
                    rescales.append(measure(log, replicas, step, move.run))
                    move.close()
        else:
            original = user_features.exactly_once
            wrap = measured_before(log, replicas, config, plan, rescales)
            user_features.exactly_once = lambda *a, **k: wrap(original(*a, **k))  # start() looks it up there
            stack.callback(setattr, user_features, "exactly_once", original)
            write_input(workdir / "input", cfg.batches, cfg.events)
            user_features.setup(config, FEATURES)
            if spark is None:
                spark = local_spark("statehouse-bench-rescale-live")
                stack.callback(spark.stop)
            query = user_features.start(
                spark,
                input_dir=str(workdir / "input"),
                output_dir=str(workdir / "output"),
                checkpoint_dir=str(workdir / "spark-checkpoint"),
                config=config,
                job=FEATURES,
            )
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            progress = [p for p in query.recentProgress if p["numInputRows"]]
        urls = replicas.urls

    batches = {p["batchId"]: p["durationMs"]["triggerExecution"] / 1000 for p in progress}
    cuts = {r["before_batch"]: r for r in rescales}
    others = [s for b, s in batches.items() if b not in cuts and b > 0]  # batch 0 warms Spark up
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
    print(
        table(
            [
                "rescale",
                "replica",
                "key groups in",
                "share",
                "stored MB",
                "checkpoint MB",
                "read MB",
                "read/share",
                "CPU s",
            ],
            share,
        )
    )
    if not batches:
        write_json(cfg.json, {"keys": cfg.keys, "rescales": rescales})
        return {"keys": cfg.keys, "rescales": rescales, "batches_s": {}}
    print("\nMicro-batch durations (triggerExecution, s); the cut's batch includes its rescale:")
    median = statistics.median(others) if others else float("nan")
    print(table(["batch", "s", "note"], [[b, f"{s:.2f}", "cut" if b in cuts else ""] for b, s in batches.items()]))
    print(f"median of the other batches (batch 0 left out: it warms Spark up): {median:.2f} s")
    result = {"keys": cfg.keys, "rescales": rescales, "batches_s": batches, "median_other_s": median}
    write_json(cfg.json, result)
    return result


if __name__ == "__main__":
    main()
