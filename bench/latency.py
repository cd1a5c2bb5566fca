"""Benchmark 2: single-operation latency over HTTP (GET/PUT of one key), both backends.

Open loop at a fixed rate (default 1,000 req/s, 16 keep-alive connections) and closed loop
at saturation; p50/p99/p99.9 per run. For scale, the same run measures the Python client's
single-call path (``ValueStateHandle.value/update``, one thread, closed loop) and, when
``redis-server`` is installed, redis-py single GET/SET round trips.

    .venv/bin/python -m bench.latency --runs 3
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import orjson

from bench.batch_ops import setup_job
from bench.common import VALUE, Summary, keys, print_header, redis_server, statehouse, table, write_json
from bench.loadgen import http_request, run_load

JOB = "bench"


def requests_for(op: str, key_list: list[str]):
    body = orjson.dumps({"value": VALUE})
    n = len(key_list)
    if op == "get":
        cache = [http_request("GET", f"/v1/jobs/{JOB}/states/v/keys/{k}") for k in key_list]
    else:
        cache = [http_request("PUT", f"/v1/jobs/{JOB}/states/v/keys/{k}", body) for k in key_list]
    return lambda i: cache[i % n]


def _client_loop(url: str, op: str, key_list: list[str], count: int) -> list[float]:
    from statehouse.client import StatehouseClient

    with StatehouseClient([url]) as client:
        state = client.job(JOB).value_state("v")
        call = state.value if op == "get" else lambda key: state.update(key, VALUE)
        return _timed_calls(call, key_list, count)


def _timed_calls(call, key_list: list[str], count: int) -> list[float]:
    """Seconds each of ``count`` calls took, cycling through the keys."""
    latencies = []
    for i in range(count):
        key = key_list[i % len(key_list)]
        started = time.perf_counter()
        call(key)
        latencies.append(time.perf_counter() - started)
    return latencies


def _percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    pick = lambda p: ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000  # noqa: E731
    return {"p50_ms": pick(50), "p99_ms": pick(99), "p999_ms": pick(99.9), "req_per_s": 0.0}


def _redis_loop(port: int, op: str, key_list: list[str], count: int) -> list[float]:
    import redis

    r = redis.Redis(host="127.0.0.1", port=port)
    value = VALUE.encode()
    try:
        return _timed_calls(r.get if op == "get" else lambda key: r.set(key, value), key_list, count)
    finally:
        r.close()


def add_row(rows, results, system: str, op: str, mode: str, runs: list[dict[str, float]]) -> None:
    def s(field: str) -> Summary:
        return Summary([r[field] for r in runs])

    rate = s("req_per_s").fmt() if runs[0]["req_per_s"] else "-"
    rows.append([system, op, mode, rate, s("p50_ms").fmt(1, 2), s("p99_ms").fmt(1, 2), s("p999_ms").fmt(1, 2)])
    results.append({"system": system, "op": op, "mode": mode, "runs": runs})
    p50, p99 = s("p50_ms").fmt(1, 2), s("p99_ms").fmt(1, 2)
    print(f"  {system} {op} {mode}: p50 {p50} p99 {p99} ms, {rate} req/s", flush=True)


def bench_backend(backend: str, cfg: argparse.Namespace, rows, results) -> None:
    key_list = keys(cfg.keys)
    with statehouse(backend) as server:
        setup_job(server.url)
        for op in ("put", "get"):
            make = requests_for(op, key_list)
            run_load(server.url, make, min(2000, cfg.count), connections=4)  # warm-up (and fill the keys)
            for rate in cfg.rates:
                count = int(rate * cfg.seconds)
                runs = [
                    run_load(server.url, make, count, rate=rate, connections=cfg.connections).summary()
                    for _ in range(cfg.runs)
                ]
                add_row(rows, results, f"statehouse {backend}", op, f"open loop {rate:,.0f}/s", runs)
            runs = [
                run_load(server.url, make, cfg.count, connections=cfg.connections).summary() for _ in range(cfg.runs)
            ]
            add_row(rows, results, f"statehouse {backend}", op, f"saturation, {cfg.connections} conns", runs)
            runs = []
            for _ in range(cfg.runs):
                started = time.perf_counter()
                lat = _client_loop(server.url, op, key_list, cfg.client_count)
                runs.append({**_percentiles(lat), "req_per_s": len(lat) / (time.perf_counter() - started)})
            add_row(rows, results, f"statehouse {backend}", op, "python client, 1 thread", runs)


def bench_redis(cfg: argparse.Namespace, rows, results) -> None:
    with redis_server() as port:
        if port is None:
            print("redis-server not on PATH: Redis baseline skipped")
            return
        key_list = keys(cfg.keys)
        for op in ("put", "get"):
            runs = []
            for _ in range(cfg.runs):
                started = time.perf_counter()
                lat = _redis_loop(port, op, key_list, cfg.client_count)
                runs.append({**_percentiles(lat), "req_per_s": len(lat) / (time.perf_counter() - started)})
            add_row(rows, results, "redis-py", op, "1 thread, closed loop", runs)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[1000.0])
    p.add_argument("--seconds", type=float, default=10.0, help="length of each open-loop run")
    p.add_argument("--count", type=int, default=20_000, help="requests per saturation run")
    p.add_argument("--client-count", type=int, default=2_000, help="calls per Python-client run")
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--backends", type=lambda s: [x for x in s.split(",") if x], default=["rocksdb", "heap"])
    p.add_argument("--no-redis", action="store_true")
    p.add_argument("--json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header("Single-operation latency over HTTP (ms, median of runs, min-max)")
    rows: list[list[Any]] = []
    results: list[dict] = []
    for backend in cfg.backends:
        bench_backend(backend, cfg, rows, results)
    if not cfg.no_redis:
        bench_redis(cfg, rows, results)
    print()
    print(table(["system", "op", "load", "req/s", "p50 ms", "p99 ms", "p99.9 ms"], rows))
    write_json(cfg.json, {"benchmark": "latency", "results": results})
    return {"results": results}


if __name__ == "__main__":
    main()
