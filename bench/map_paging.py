"""Benchmark 10: paging a 1,000,000-entry map end to end, with /healthz polled meanwhile.

One replica per backend (tests/support/server.py), one map state with one key holding N entries
(user keys ``u0000000``..., 16-byte string values), filled in random order through the batch
endpoint with msgpack (10,000 ``map_put`` per request). Then, for each backend:

* **paging**: ``GET .../keys/{key}/entries?limit=1000`` from the first page to the last,
  following ``next_cursor``, ``--passes`` times over the same map; per-page latency (p50 / p99 /
  max), total time, and server CPU per page (the uvicorn process's CPU clock, every thread,
  read around the pass). Every entry is checked to come back once, in order. ``--max-pages``
  stops early (the old code read the whole map for every page: 1,000 of them take many minutes).
* **whole map**: one ``GET .../keys/{key}`` of the whole map (the server is started with
  ``STATEHOUSE_MAX_MAP_READ_ENTRIES`` = N so that it is served, not refused), and one of a map
  of ``--at-limit`` entries (100,000: the default limit, the largest map read whole by default).
* **/healthz**: a second process polls ``GET /healthz`` every ``--poll-ms`` on its own
  connection while each of the above runs; p50 / p99 / max of its latency per phase, and
  idle (before the fill) as the baseline.

The server under test is whatever ``statehouse`` the uvicorn process imports: to measure an
older tree, put it first on PYTHONPATH (see bench/RESULTS.md §10) and pass ``--label``.

    .venv/bin/python -m bench.map_paging                       # 1,000,000 entries, both backends
    .venv/bin/python -m bench.map_paging --quick               # smoke run, a few seconds
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx
import msgpack

from bench.common import print_header, process_cpu_ns, statehouse, table, write_json

JOB, STATE, KEY = "paging", "m", "big"
MSGPACK = "application/msgpack"


def user_key(i: int) -> str:
    return f"u{i:07d}"


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 / p99 / max (and count) of latencies in seconds."""
    if not values:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"n": len(ordered), "p50": statistics.median(ordered), "p99": p99, "max": ordered[-1]}


def _poll(url: str, interval: float, stop: Any, out: Any) -> None:
    gc.collect()
    gc.freeze()  # as in main(): this process's own full collections are not the server's latency
    latencies: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as http:
        http.get("/healthz").raise_for_status()  # connected before the first measured poll
        out.put("ready")
        while not stop.is_set():
            start = time.perf_counter()
            http.get("/healthz").raise_for_status()
            latencies.append(time.perf_counter() - start)
            stop.wait(interval)
    out.put(latencies)


class HealthPoller:
    """Polls /healthz every ``interval`` seconds on its own connection, from its own process: a
    thread here would also wait for this process's GIL (decoding a whole map's JSON holds it for
    a second), and that is not the server's latency."""

    def __init__(self, url: str, interval: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop, self._out = context.Event(), context.Queue()
        self._process = context.Process(target=_poll, args=(url, interval, self._stop, self._out), daemon=True)
        self.latencies: list[float] = []

    def __enter__(self) -> HealthPoller:
        self._process.start()
        if self._out.get(timeout=60) != "ready":
            raise RuntimeError("the /healthz poller did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.latencies = self._out.get(timeout=60)
        self._process.join(timeout=10)


def fill(http: httpx.Client, key: str, entries: int, batch: int = 10_000) -> float:
    """``entries`` entries in random order (as a job writes them; an index sorted as it is
    filled would hide what sorting costs)."""
    value = "v" * 16
    order = list(range(entries))
    random.Random(entries).shuffle(order)
    start = time.perf_counter()
    for first in range(0, entries, batch):
        ops = [
            {"op": "map_put", "state": STATE, "key": key, "user_key": user_key(i), "value": value}
            for i in order[first : first + batch]
        ]
        r = http.post(f"/v1/jobs/{JOB}/batch", content=msgpack.packb({"ops": ops}), headers={"Content-Type": MSGPACK})
        r.raise_for_status()
    return time.perf_counter() - start


def page_through(http: httpx.Client, entries: int, page: int, max_pages: int | None) -> dict[str, Any]:
    """Every page from the first, checking each entry comes back once and in order."""
    latencies: list[float] = []
    cursor: str | None = None
    seen = 0
    start = time.perf_counter()
    while True:
        params: dict[str, Any] = {"limit": page, **({"cursor": cursor} if cursor else {})}
        t0 = time.perf_counter()
        r = http.get(f"/v1/jobs/{JOB}/states/{STATE}/keys/{KEY}/entries", params=params)
        latencies.append(time.perf_counter() - t0)
        r.raise_for_status()
        body = r.json()
        keys = [item["key"] for item in body["items"]]
        if keys != [user_key(i) for i in range(seen, seen + len(keys))]:
            raise AssertionError(f"page {len(latencies)}: entries out of order or missing after {seen}")
        seen += len(keys)
        cursor = body["next_cursor"]
        if cursor is None or (max_pages is not None and len(latencies) >= max_pages):
            break
    total = time.perf_counter() - start
    if max_pages is None and seen != entries:
        raise AssertionError(f"paged {seen} entries of {entries}")
    slowest = sorted(range(len(latencies)), key=latencies.__getitem__)[-3:][::-1]
    return {
        "pages": len(latencies),
        "entries": seen,
        "total_s": total,
        "page_s": percentiles(latencies),
        "slowest_pages": [{"page": i + 1, "ms": latencies[i] * 1000} for i in slowest],  # 1 = the first
    }


def during(url: str, interval: float, work: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    with HealthPoller(url, interval) as poller:
        result = work()
    return result, percentiles(poller.latencies)


def whole_map(http: httpx.Client, key: str, entries: int) -> float:
    t0 = time.perf_counter()
    r = http.get(f"/v1/jobs/{JOB}/states/{STATE}/keys/{key}")
    r.raise_for_status()
    if len(r.json()["value"]) != entries:
        raise AssertionError("the whole map came back short")
    return time.perf_counter() - t0


def run_backend(backend: str, cfg: argparse.Namespace) -> dict[str, Any]:
    env = {"STATEHOUSE_MAX_MAP_READ_ENTRIES": str(cfg.entries)}  # the big map may be read whole, to compare
    with statehouse(backend, env) as server, httpx.Client(base_url=server.url, timeout=600) as http:
        pid, interval = server.process.pid, cfg.poll_ms / 1000
        _none, idle = during(server.url, interval, lambda: time.sleep(cfg.idle_seconds))
        http.put(f"/v1/jobs/{JOB}", json={"max_parallelism": 128}).raise_for_status()
        http.put(f"/v1/jobs/{JOB}/states/{STATE}", json={"kind": "map"}).raise_for_status()
        fill_s = fill(http, KEY, cfg.entries)
        print(f"  {backend}: filled {cfg.entries:,} entries in {fill_s:.1f} s", flush=True)
        passes = []
        for n in range(cfg.passes):
            cpu0 = process_cpu_ns(pid)
            paged, health = during(
                server.url, interval, lambda: page_through(http, cfg.entries, cfg.page, cfg.max_pages)
            )
            paged["server_cpu_ms_per_page"] = (process_cpu_ns(pid) - cpu0) / 1e6 / paged["pages"]
            paged["healthz"] = health
            passes.append(paged)
            slowest = ", ".join(f"page {p['page']}: {p['ms']:,.1f} ms" for p in paged["slowest_pages"])
            print(
                f"  {backend} pass {n + 1}: {paged['pages']:,} pages, page p99 {ms(paged['page_s']['p99'])} ms, "
                f"/healthz p99 {ms(health['p99'])} ms; slowest {slowest}",
                flush=True,
            )
        whole = []
        if not cfg.no_whole:
            sizes = {KEY: cfg.entries, "at-limit": cfg.at_limit}
            fill(http, "at-limit", cfg.at_limit)
            for key, size in sizes.items():
                seconds, health = during(server.url, interval, lambda key=key, size=size: whole_map(http, key, size))
                whole.append({"entries": size, "total_s": seconds, "healthz": health})
    return {
        "backend": backend,
        "label": cfg.label,
        "entries": cfg.entries,
        "page_size": cfg.page,
        "fill_s": fill_s,
        "passes": passes,
        "whole_map": whole,
        "healthz_idle": idle,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--page", type=int, default=1000, help="entries per page (the server caps it at 1,000)")
    p.add_argument("--backends", default="rocksdb,heap")
    p.add_argument("--max-pages", type=int, default=None, help="stop after this many pages (the old code)")
    p.add_argument("--poll-ms", type=float, default=10, help="pause between two /healthz polls")
    p.add_argument("--idle-seconds", type=float, default=5, help="/healthz polled alone first, as the baseline")
    p.add_argument("--passes", type=int, default=3, help="paging passes over the filled map")
    p.add_argument("--at-limit", type=int, default=100_000, help="a second map read whole: the default limit")
    p.add_argument("--no-whole", action="store_true", help="skip the whole-map GETs")
    p.add_argument("--label", default="", help="which code the server runs (e.g. before / after)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--quick", action="store_true", help="smoke run: 20,000 entries, a few seconds")
    cfg = p.parse_args(argv)
    if cfg.quick:
        cfg.entries, cfg.idle_seconds, cfg.passes, cfg.at_limit = 20_000, 0.2, 1, 2_000
    return cfg


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


def median_of(passes: list[dict[str, Any]], *path: str) -> float:
    values = []
    for p in passes:
        value: Any = p
        for part in path:
            value = value[part]
        values.append(value)
    return statistics.median(values)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    # This process's full collections (httpx's, botocore's objects: ~45 ms) would otherwise land in
    # one page's and one /healthz poll's latency: what exists now is left out of them.
    gc.collect()
    gc.freeze()
    print_header(f"Paging a {cfg.entries:,}-entry map, {cfg.page:,} entries per page, /healthz polled meanwhile")
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f}")
    results = [run_backend(b, cfg) for b in cfg.backends.split(",") if b]
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.2f}\n")
    rows, whole_rows = [], []
    for r in results:
        passes, name = r["passes"], f"{r['backend']} {r['label']}".strip()
        worst = max(p["page_s"]["max"] for p in passes)
        worst_health = max(p["healthz"]["max"] for p in passes)
        rows.append(
            [
                name,
                f"{len(passes)} x {passes[0]['pages']:,}",
                f"{ms(median_of(passes, 'page_s', 'p50'))} / {ms(median_of(passes, 'page_s', 'p99'))} / {ms(worst)}",
                f"{median_of(passes, 'total_s'):,.1f}",
                f"{median_of(passes, 'server_cpu_ms_per_page'):,.1f}",
                f"{ms(median_of(passes, 'healthz', 'p50'))} / {ms(median_of(passes, 'healthz', 'p99'))} / "
                f"{ms(worst_health)}",
                f"{ms(r['healthz_idle']['p50'])} / {ms(r['healthz_idle']['p99'])} / {ms(r['healthz_idle']['max'])}",
            ]
        )
        for w in r["whole_map"]:
            health = w["healthz"]
            whole_rows.append(
                [name, f"{w['entries']:,}", f"{w['total_s']:,.2f}", f"{ms(health['p99'])} / {ms(health['max'])}"]
            )
    headers = [
        "backend",
        "passes x pages",
        "page ms p50 / p99 / max",
        "all pages s",
        "server CPU ms / page",
        "/healthz ms while paging p50 / p99 / max",
        "/healthz ms idle p50 / p99 / max",
    ]
    print(table(headers, rows))
    if whole_rows:
        print()
        print(table(["backend", "whole-map GET of", "s", "/healthz ms during it p99 / max"], whole_rows))
    out = {"config": vars(cfg), "results": results}
    write_json(cfg.json, out)
    return out


if __name__ == "__main__":
    main()
