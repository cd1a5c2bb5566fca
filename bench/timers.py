"""Benchmark 11: timers — registering, and firing on watermark advances, end to end.

One replica per backend (tests/support/server.py), one job (max parallelism 128), N event-time timers
on N distinct 16-byte keys, timestamps spread evenly over ``[0, N)`` ms. Through the Python
client, for each backend:

* **register**: all N timers through the batch endpoint (msgpack, ``register_timer``, 5,000 per
  request), then, into a fresh job, all N through the columnar endpoint (``register_many``,
  Arrow, 10,000 rows per request): timers per second.
* **advance, nothing due**: ``--idle`` advances to a time below every timer (N stored): the cost
  of looking at every key group (128 seeks), per advance p50 / p99.
* **advance, firing**: the watermark moved from 0 to N in ``--steps`` equal steps, each firing
  about N / steps timers (at most 10,000 per answer: the client asks again while ``more``);
  per advance p50 / p99, and timers fired per second over all steps. Every timer is checked
  to fire once, in timestamp order.

Fired timers come back as JSON or msgpack rows only: the timer API has a columnar (Arrow)
register and delete, but no columnar advance, so firing has no columnar path to measure.

**checkpoint** (``--parts checkpoint``): ``--checkpoint-timers`` (1,000,000) event-time timers
registered through the columnar endpoint into a fresh job on a replica checkpointing to a
local directory, then checkpoint 1 and savepoint 2 of that job; for comparison the same keys
as a value state of small ints (``i % 100``, columnar ``put_many``) in a second job, checkpoint
1. RocksDB runs twice, with incremental checkpoints on (the default: checkpoint 1 uploads every
SST) and off (the full canonical format, the heap's only one). Per snapshot: ``bytes_uploaded``
of its status, the bytes it added to the checkpoint directory, bytes per timer (per key), the
time from trigger to uploaded and the server's ``duration_ms``. Then a fresh replica (same
backend, same checkpoint directory, empty data directory) restores checkpoint 1, and after it
savepoint 2: the restore's ``duration_ms`` and wall time, and the ``counts`` endpoint's total
checked to be every timer. ``--runs`` (3) fresh replicas per configuration: bytes of the median
run, times as median (min-max). ``--compression none`` stores the full format's key groups
unzstd'ed (``STATEHOUSE_SNAPSHOT_COMPRESSION``): the keys and timestamps here are sequential,
so zstd shrinks them far more than it would real ones.

    .venv/bin/python -m bench.timers                    # both parts, both backends
    .venv/bin/python -m bench.timers --parts fire       # 200,000 timers registered and fired
    .venv/bin/python -m bench.timers --parts checkpoint # 1,000,000 timers checkpointed, restored
    .venv/bin/python -m bench.timers --parts checkpoint --compression none
    .venv/bin/python -m bench.timers --quick            # smoke run of both, ~20 s
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.common import Summary, keys, print_header, statehouse, table, write_json
from bench.state import checkpoint, dir_bytes, mb
from statehouse.client import StatehouseClient


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"n": len(ordered), "p50": statistics.median(ordered), "p99": p99, "max": ordered[-1]}


def run_backend(backend: str, cfg: argparse.Namespace) -> dict[str, Any]:
    importlib.import_module("statehouse.client.timer_columns")  # pyarrow and pandas load: not part of the timing

    names = keys(cfg.timers, prefix="t")
    stamps = list(range(cfg.timers))
    with statehouse(backend) as server, StatehouseClient(server.url) as client:
        # register: row-wise batches
        job = client.create_job("timers-batch", 128)
        start = time.perf_counter()
        for first in range(0, cfg.timers, 5_000):
            with job.batch(max_ops=5_000) as batch:
                for key, ts in zip(names[first : first + 5_000], stamps[first : first + 5_000], strict=True):
                    batch.register_timer(key, ts)
        batch_s = time.perf_counter() - start
        # register: columns
        columnar_job = client.create_job("timers-columns", 128)
        start = time.perf_counter()
        columnar_job.timers("event").register_many(names, stamps)
        columns_s = time.perf_counter() - start
        assert sum(columnar_job.timers("event").counts().values()) == cfg.timers

        timers = job.timers("event")
        idle = []
        for _ in range(cfg.idle):
            start = time.perf_counter()
            assert timers.advance(-1) == []
            idle.append(time.perf_counter() - start)

        step = cfg.timers // cfg.steps
        firing, fired = [], 0
        previous = -1
        started = time.perf_counter()
        for to in range(step - 1, cfg.timers + step - 1, step):
            start = time.perf_counter()
            out = timers.advance(to)
            firing.append(time.perf_counter() - start)
            assert [t.timestamp for t in out] == list(range(previous + 1, min(to, cfg.timers - 1) + 1))
            previous = min(to, cfg.timers - 1)
            fired += len(out)
        fire_s = time.perf_counter() - started
        assert fired == cfg.timers and timers.counts() == {}
    return {
        "backend": backend,
        "timers": cfg.timers,
        "register_batch_per_s": cfg.timers / batch_s,
        "register_columns_per_s": cfg.timers / columns_s,
        "advance_idle_s": percentiles(idle),
        "advance_firing_s": percentiles(firing),
        "fired_per_s": fired / fire_s,
        "steps": cfg.steps,
    }


TIMER_JOB, VALUE_JOB = "ckpt-timers", "ckpt-values"


def snapshot(http: httpx.Client, root: Path, job: str, checkpoint_id: int, kind: str = "checkpoint") -> dict[str, Any]:
    """Take one checkpoint or savepoint of ``job`` and complete it: its bytes and times."""
    before = dir_bytes(root / job) if (root / job).exists() else 0
    info, seconds = checkpoint(http, job, checkpoint_id, kind)
    assert info["status"] == "completed", info
    return {
        "kind": kind,
        "format": info["format"],
        "bytes_uploaded": info["bytes_uploaded"],
        "bytes_reused": info["bytes_reused"],
        "dir_bytes": dir_bytes(root / job) - before,
        "upload_s": seconds,
        "duration_ms": info["duration_ms"],
    }


def timer_total(http: httpx.Client, job: str) -> int:
    response = http.get(f"/v1/jobs/{job}/timers/event/counts")
    response.raise_for_status()
    return response.json()["total"]


def restore(http: httpx.Client, job: str, checkpoint_id: int, expected: int) -> dict[str, Any]:
    """Restore ``checkpoint_id`` of ``job`` and check every timer came back."""
    start = time.perf_counter()
    response = http.post(f"/v1/jobs/{job}/restore", json={"checkpoint_id": checkpoint_id})
    response.raise_for_status()
    wall = time.perf_counter() - start
    info = response.json()
    total = timer_total(http, job)
    assert total == expected, f"restored {total} timers of {expected}"
    return {
        "checkpoint_id": checkpoint_id,
        "wall_s": wall,
        "duration_ms": info["duration_ms"],
        "bytes_read": info["bytes_read"],
        "entries_restored": info["entries_restored"],
        "timers_counted": total,
    }


def checkpoint_backend(backend: str, incremental: bool | None, cfg: argparse.Namespace) -> dict[str, Any]:
    """1M timers (and 1M small ints) checkpointed on one replica, restored on a fresh one."""
    importlib.import_module("statehouse.client.timer_columns")
    count = cfg.checkpoint_timers
    names = keys(count, prefix="t")
    stamps = np.arange(count, dtype=np.int64)
    env = {"STATEHOUSE_SNAPSHOT_COMPRESSION": cfg.compression} if cfg.compression else {}
    if incremental is not None:
        env["STATEHOUSE_INCREMENTAL_CHECKPOINTS"] = str(incremental).lower()
    workdir = Path(tempfile.mkdtemp(prefix="statehouse-bench-timer-ckpt-"))
    root = workdir / "checkpoints"
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        with (
            statehouse(backend, env, workdir) as server,
            StatehouseClient(server.url) as client,
            httpx.Client(base_url=server.url, timeout=1800) as http,
        ):
            job = client.create_job(TIMER_JOB, 128)
            start = time.perf_counter()
            job.timers("event").register_many(names, stamps)
            out["register_s"] = time.perf_counter() - start
            assert timer_total(http, TIMER_JOB) == count
            out["data_bytes"] = dir_bytes(workdir / "data" / TIMER_JOB)
            out["checkpoint"] = snapshot(http, root, TIMER_JOB, 1)
            out["savepoint"] = snapshot(http, root, TIMER_JOB, 2, "savepoint")

            values = client.create_job(VALUE_JOB, 128)
            values.register("v", "value")
            values.value_state("v").put_many(names, stamps % 100)
            out["values_data_bytes"] = dir_bytes(workdir / "data" / VALUE_JOB)
            out["values_checkpoint"] = snapshot(http, root, VALUE_JOB, 1)
        # a fresh replica: empty data directory, the same checkpoint directory
        fresh = {**env, "STATEHOUSE_CHECKPOINT_DIR": str(root)}
        with (
            statehouse(backend, fresh, workdir / "restored") as server,
            httpx.Client(base_url=server.url, timeout=1800) as http,
        ):
            out["restore_checkpoint"] = restore(http, TIMER_JOB, 1, count)
            out["restore_savepoint"] = restore(http, TIMER_JOB, 2, count)
    return out


def config_name(r: dict[str, Any]) -> str:
    if r["incremental"] is None:
        return r["backend"]
    return f"{r['backend']} (incremental {'on' if r['incremental'] else 'off'})"


def checkpoint_rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    """Bytes (the median run's: they vary by a few bytes), and trigger->uploaded, median (min-max)."""
    rows = []
    for r in results:
        n = r["timers"]
        for what, field in (
            ("timers: checkpoint 1", "checkpoint"),
            ("timers: savepoint 2", "savepoint"),
            ("small ints: checkpoint 1", "values_checkpoint"),
        ):
            snaps = [run[field] for run in r["runs"]]
            uploaded = Summary([x["bytes_uploaded"] for x in snaps]).median
            rows.append(
                [
                    config_name(r),
                    what,
                    snaps[0]["format"],
                    mb(uploaded),
                    mb(Summary([x["dir_bytes"] for x in snaps]).median),
                    f"{uploaded / n:.1f}",
                    Summary([x["upload_s"] for x in snaps]).fmt(1, 2, " s"),
                ]
            )
    return rows


def restore_rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for r in results:
        for what, field in (("checkpoint 1", "restore_checkpoint"), ("savepoint 2", "restore_savepoint")):
            restores = [run[field] for run in r["runs"]]
            rows.append(
                [
                    config_name(r),
                    what,
                    Summary([x["wall_s"] for x in restores]).fmt(1, 2, " s"),
                    Summary([x["duration_ms"] / 1000 for x in restores]).fmt(1, 2, " s"),
                    mb(Summary([x["bytes_read"] for x in restores]).median),
                    f"{restores[0]['entries_restored']:,}",
                    f"{restores[0]['timers_counted']:,}",
                ]
            )
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timers", type=int, default=200_000)
    p.add_argument("--steps", type=int, default=100, help="watermark advances that fire every timer")
    p.add_argument("--idle", type=int, default=50, help="advances with nothing due")
    p.add_argument("--checkpoint-timers", type=int, default=1_000_000, help="timers checkpointed and restored")
    p.add_argument("--runs", type=int, default=3, help="runs of the checkpoint part per configuration")
    p.add_argument("--compression", choices=["zstd", "none"], help="STATEHOUSE_SNAPSHOT_COMPRESSION (default zstd)")
    p.add_argument("--parts", default="fire,checkpoint", help="fire (register and fire), checkpoint, or both")
    p.add_argument("--backends", default="rocksdb,heap")
    p.add_argument("--json", help="write the results here")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 5,000 timers, 2,000 checkpointed (RocksDB incremental only)"
    )
    cfg = p.parse_args(argv)
    cfg.parts = [x for x in cfg.parts.split(",") if x]
    if set(cfg.parts) - {"fire", "checkpoint"}:
        p.error(f"--parts takes fire and checkpoint; got {cfg.parts}")
    if cfg.quick:
        cfg.timers, cfg.steps, cfg.idle, cfg.checkpoint_timers, cfg.runs = 5_000, 10, 5, 2_000, 1
    return cfg


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


def fire_table(cfg: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    rows = [
        [
            r["backend"],
            f"{r['register_batch_per_s']:,.0f}",
            f"{r['register_columns_per_s']:,.0f}",
            f"{ms(r['advance_idle_s']['p50'])} / {ms(r['advance_idle_s']['p99'])}",
            f"{ms(r['advance_firing_s']['p50'])} / {ms(r['advance_firing_s']['p99'])}",
            f"{r['fired_per_s']:,.0f}",
        ]
        for r in results
    ]
    headers = [
        "backend",
        "register/s (batch)",
        "register/s (columns)",
        "advance, none due: ms p50 / p99",
        f"advance firing ~{cfg.timers // cfg.steps:,}: ms p50 / p99",
        "fired/s",
    ]
    return table(headers, rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    backends = [b for b in cfg.backends.split(",") if b]
    titles = []
    if "fire" in cfg.parts:
        titles.append(f"{cfg.timers:,} registered and fired in {cfg.steps} watermark advances")
    if "checkpoint" in cfg.parts:
        titles.append(f"{cfg.checkpoint_timers:,} checkpointed and restored")
    print_header("Timers: " + "; ".join(titles))
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f}")
    out: dict[str, Any] = {"config": vars(cfg), "results": [], "checkpoints": []}
    if "fire" in cfg.parts:
        out["results"] = [run_backend(b, cfg) for b in backends]
        print(f"load average (1 min) after firing: {os.getloadavg()[0]:.2f}\n")
        print(fire_table(cfg, out["results"]) + "\n")
    if "checkpoint" in cfg.parts:
        for backend in backends:
            # quick: RocksDB's default (incremental) only, to keep the smoke test short
            formats = ((True,) if cfg.quick else (True, False)) if backend == "rocksdb" else (None,)
            for incremental in formats:
                runs = []
                for run in range(cfg.runs):
                    r = checkpoint_backend(backend, incremental, cfg)
                    runs.append(r)
                    print(
                        f"  {backend} incremental={incremental} run {run + 1}: registered in {r['register_s']:.1f} s, "
                        f"checkpoint {mb(r['checkpoint']['bytes_uploaded'])} in {r['checkpoint']['upload_s']:.1f} s, "
                        f"restored in {r['restore_checkpoint']['wall_s']:.1f} s; load {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
                config = {"backend": backend, "incremental": incremental, "timers": cfg.checkpoint_timers}
                out["checkpoints"].append({**config, "runs": runs})
        print(f"load average (1 min) at end: {os.getloadavg()[0]:.2f}\n")
        headers = ["backend", "snapshot", "format", "bytes_uploaded", "on disk", "bytes/timer (key)"]
        print(table([*headers, "trigger->uploaded"], checkpoint_rows(out["checkpoints"])) + "\n")
        headers = ["backend", "restored", "time", "server duration", "bytes read", "entries", "timers counted"]
        print(table(headers, restore_rows(out["checkpoints"])))
    write_json(cfg.json, out)
    return out


if __name__ == "__main__":
    main()
