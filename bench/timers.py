"""Benchmark 11: timers — registering, and firing on watermark advances, end to end.

One replica per backend (harness/server.py), one job (max parallelism 128), N event-time timers
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

    .venv/bin/python -m bench.timers                    # 200,000 timers, both backends
    .venv/bin/python -m bench.timers --quick            # smoke run, a few seconds
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time
from typing import Any

from bench.common import keys, print_header, statehouse, table, write_json
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


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timers", type=int, default=200_000)
    p.add_argument("--steps", type=int, default=100, help="watermark advances that fire every timer")
    p.add_argument("--idle", type=int, default=50, help="advances with nothing due")
    p.add_argument("--backends", default="rocksdb,heap")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--quick", action="store_true", help="smoke run: 5,000 timers")
    cfg = p.parse_args(argv)
    if cfg.quick:
        cfg.timers, cfg.steps, cfg.idle = 5_000, 10, 5
    return cfg


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header(f"Timers: {cfg.timers:,} registered and fired in {cfg.steps} watermark advances")
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f}")
    results = [run_backend(b, cfg) for b in cfg.backends.split(",") if b]
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.2f}\n")
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
    print(table(headers, rows))
    out = {"config": vars(cfg), "results": results}
    write_json(cfg.json, out)
    return out


if __name__ == "__main__":
    main()
