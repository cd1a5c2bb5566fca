"""Benchmark 3: write latency while an asynchronous checkpoint of a large state uploads.

One RocksDB replica checkpointing to SeaweedFS S3 (``--storage local`` for a local directory).
Per run: single PUTs at a fixed open-loop rate with no checkpoint (baseline), then the same
load while a checkpoint uploads; latencies are those of requests released between the
trigger and the end of the upload. Two snapshot formats: ``full`` (incremental checkpoints
off: the whole state is scanned, encoded and uploaded every time) and ``incremental`` (the
first checkpoint of a fresh job: every SST file is uploaded).

    .venv/bin/python -m bench.checkpoint_writes --runs 3 --keys 1000000
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import Summary, print_header, s3_settings, statehouse, table, write_json
from bench.latency import requests_for
from bench.loadgen import run_load
from bench.state import create_job, dir_bytes, fill, mb, trigger, wait_uploaded


def _load(url: str, job: str, cfg: argparse.Namespace, stop=None):
    make = requests_for("put", [f"w{i:015d}" for i in range(10_000)])
    make_for_job = lambda i: make(i).replace(b"/jobs/bench/", f"/jobs/{job}/".encode())  # noqa: E731
    count = int(cfg.rate * cfg.max_seconds)
    return run_load(url, make_for_job, count, rate=cfg.rate, connections=cfg.connections, stop=stop)


def measure_run(url: str, job: str, checkpoint_id: int, cfg: argparse.Namespace) -> dict[str, Any]:
    """Baseline load, then the same load during one checkpoint upload."""
    baseline_cfg = argparse.Namespace(**{**vars(cfg), "max_seconds": cfg.baseline_seconds})
    baseline = _load(url, job, baseline_cfg).summary()
    window: dict[str, float] = {}
    done = threading.Event()

    def checkpointer() -> None:
        with httpx.Client(base_url=url, timeout=600) as http:
            time.sleep(0.5)  # let the load settle first
            window["start"] = time.perf_counter()
            trigger(http, job, checkpoint_id)
            window["info"] = wait_uploaded(http, job, checkpoint_id)
            window["end"] = time.perf_counter()
            done.set()
            http.post(f"/v1/jobs/{job}/checkpoints/{checkpoint_id}/complete").raise_for_status()

    thread = threading.Thread(target=checkpointer)
    thread.start()
    try:
        loaded = _load(url, job, cfg, stop=done.is_set)
    finally:
        thread.join(timeout=cfg.max_seconds + 600)
    during = loaded.window(window["start"], window["end"]).summary()
    info = window["info"]
    return {
        "baseline": baseline,
        "during": during,
        "upload_s": window["end"] - window["start"],
        "bytes_uploaded": info["bytes_uploaded"],
    }


def bench_mode(mode: str, env: dict[str, str], cfg: argparse.Namespace, rows, results) -> None:
    runs = []
    settings = {**env, "STATEHOUSE_INCREMENTAL_CHECKPOINTS": "false" if mode == "full" else "true"}
    workdir = Path(tempfile.mkdtemp(prefix="statehouse-bench-ckw-"))
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, workdir, ignore_errors=True)
        measure_runs(mode, settings, workdir, cfg, runs)
    summarize(mode, runs, rows, results)


def measure_runs(mode: str, settings: dict[str, str], workdir: Path, cfg: argparse.Namespace, runs: list) -> None:
    with statehouse("rocksdb", settings, workdir) as server, httpx.Client(base_url=server.url, timeout=600) as http:
        for run in range(cfg.runs):
            job = f"ckw{run}" if mode == "incremental" else "ckw"
            if run == 0 or mode == "incremental":  # incremental: a fresh job, so all its SSTs upload
                create_job(http, job)
                fill(http, job, cfg.keys)
            result = measure_run(server.url, job, run + 1 if mode == "full" else 1, cfg)
            result["state_bytes"] = dir_bytes(workdir / "data" / job)
            runs.append(result)
            print(
                f"  {mode} run {run + 1}: upload {result['upload_s']:.1f}s {mb(result['bytes_uploaded'])}; "
                f"p99 baseline {result['baseline']['p99_ms']:.2f} ms, during {result['during']['p99_ms']:.2f} ms "
                f"({result['during']['requests']} requests)",
                flush=True,
            )
            if mode == "incremental" and run + 1 < cfg.runs:
                http.delete(f"/v1/jobs/{job}").raise_for_status()


def summarize(mode: str, runs: list[dict[str, Any]], rows, results) -> None:
    def s(phase: str, field: str) -> Summary:
        return Summary([r[phase][field] for r in runs])

    ratio = Summary([r["during"]["p99_ms"] / r["baseline"]["p99_ms"] for r in runs])
    rows.append(
        [
            mode,
            mb(runs[0]["state_bytes"]),
            mb(Summary([r["bytes_uploaded"] for r in runs]).median),
            Summary([r["upload_s"] for r in runs]).fmt(1, 1, " s"),
            s("baseline", "p99_ms").fmt(1, 2),
            s("during", "p99_ms").fmt(1, 2),
            s("during", "p999_ms").fmt(1, 2),
            ratio.fmt(1, 2, "x"),
        ]
    )
    results.append({"mode": mode, "runs": runs})


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--keys", type=int, default=1_000_000, help="keys of 100 random bytes in the checkpointed state")
    p.add_argument("--rate", type=float, default=1000.0, help="single PUTs per second")
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--baseline-seconds", type=float, default=10.0)
    p.add_argument("--max-seconds", type=float, default=600.0, help="bound on one checkpoint's load phase")
    p.add_argument("--modes", type=lambda s: [x for x in s.split(",") if x], default=["full", "incremental"])
    p.add_argument("--storage", choices=["s3", "local"], default="s3")
    p.add_argument("--s3-endpoint", help="use this SeaweedFS S3 (bucket 'snapshots') instead of starting one")
    p.add_argument("--json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header("Write latency during a checkpoint upload (single PUT, open loop)")
    rows: list[list[Any]] = []
    results: list[dict] = []
    with contextlib.ExitStack() as stack:
        env = s3_settings(stack, cfg.s3_endpoint, "ckw") if cfg.storage == "s3" else {}
        for mode in cfg.modes:
            bench_mode(mode, env, cfg, rows, results)
    print()
    headers = ["format", "state on disk", "uploaded", "upload time", "p99 no ckpt ms", "p99 during ms"]
    print(table([*headers, "p99.9 during ms", "p99 ratio"], rows))
    write_json(cfg.json, {"benchmark": "checkpoint_writes", "storage": cfg.storage, "results": results})
    return {"results": results}


if __name__ == "__main__":
    main()
