"""Benchmark 1: batched keyed operations over HTTP against in-process rocksdict and Redis.

Statehouse: one replica process per backend; the client is the public ``StatehouseClient``
(``job.batch(max_ops=N)``: routing by key group, one msgpack request per N operations) or,
for JSON, ``httpx`` posting ``{"ops": [...]}`` encoded with orjson. Several concurrent client
processes write disjoint keys. Baselines in the same run: rocksdict in raw mode (WriteBatch
puts, multi-get) and Redis via redis-py (pipeline of single commands, and MSET/MGET).

    .venv/bin/python -m bench.batch_ops --runs 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import tempfile
import time
from typing import Any

import httpx
import orjson

from bench.common import VALUE, VALUE_BYTES_RAW, Summary, keys, print_header, redis_server, statehouse, table
from bench.common import write_json as save_json

OPS = ("get", "put", "list_add", "map_put")
STATES = {"get": "v", "put": "v", "list_add": "l", "map_put": "m"}
JOB = "bench"


# -- Statehouse ---------------------------------------------------------------------------


def _queue(batch: Any, op: str, key: str) -> None:
    if op == "get":
        batch.get("v", key)
    elif op == "put":
        batch.put("v", key, VALUE)
    elif op == "list_add":
        batch.add("l", key, VALUE)
    else:
        batch.map_put("m", key, "f", VALUE)


def _op_dict(op: str, key: str) -> dict[str, Any]:
    if op == "get":
        return {"op": "get", "state": "v", "key": key}
    if op == "put":
        return {"op": "put", "state": "v", "key": key, "value": VALUE}
    if op == "list_add":
        return {"op": "add", "state": "l", "key": key, "value": VALUE}
    return {"op": "map_put", "state": "m", "key": key, "user_key": "f", "value": VALUE}


def run_msgpack(url: str, op: str, batch_size: int, key_list: list[str], count: int) -> float:
    """``count`` operations through the Python client; returns seconds."""
    from statehouse.client import StatehouseClient

    with StatehouseClient([url]) as client:
        job = client.job(JOB)
        job._key_types.update({"v": "string", "l": "string", "m": "string"})  # skip the describe round trip
        n = len(key_list)
        started = time.perf_counter()
        with job.batch(max_ops=batch_size) as batch:
            for i in range(count):
                _queue(batch, op, key_list[i % n])
        return time.perf_counter() - started


def run_json(url: str, op: str, batch_size: int, key_list: list[str], count: int) -> float:
    """``count`` operations as JSON batches over httpx; returns seconds."""
    n = len(key_list)
    with httpx.Client(base_url=url, timeout=60) as http:
        started = time.perf_counter()
        for start in range(0, count, batch_size):
            ops = [_op_dict(op, key_list[i % n]) for i in range(start, min(count, start + batch_size))]
            body = orjson.dumps({"ops": ops})
            response = http.post(f"/v1/jobs/{JOB}/batch", content=body, headers={"content-type": "application/json"})
            response.raise_for_status()
            orjson.loads(response.content)
        return time.perf_counter() - started


def _client_process(args: tuple[str, str, int, int, int, Any]) -> tuple[float, float]:
    url, op, batch_size, index, count, barrier = args
    key_list = keys(count, start=index * 10_000_000, prefix=f"c{index}")
    barrier.wait()
    started = time.time()
    run_msgpack(url, op, batch_size, key_list, count)
    return started, time.time()


def run_concurrent(url: str, op: str, batch_size: int, clients: int, count: int) -> float:
    """``clients`` processes of ``count`` ops each; returns aggregate ops/s over the wall time."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(clients)
        with ctx.Pool(clients) as pool:
            spans = pool.map(_client_process, [(url, op, batch_size, i, count, barrier) for i in range(clients)])
    wall = max(e for _s, e in spans) - min(s for s, _e in spans)
    return clients * count / wall


def setup_job(url: str) -> None:
    with httpx.Client(base_url=url) as http:
        http.put(f"/v1/jobs/{JOB}").raise_for_status()
        for name, kind in (("v", "value"), ("l", "list"), ("m", "map")):
            http.put(f"/v1/jobs/{JOB}/states/{name}", json={"kind": kind}).raise_for_status()


def bench_statehouse(backend: str, cfg: argparse.Namespace, rows: list[list[Any]], results: list[dict]) -> None:
    key_list = keys(cfg.keys)
    with statehouse(backend) as server:
        setup_job(server.url)
        run_msgpack(server.url, "put", 1000, key_list, len(key_list))  # preload every key once (gets find data)
        for batch_size in cfg.batch_sizes:
            for fmt in cfg.formats:
                for op in cfg.ops:
                    runner = run_msgpack if fmt == "msgpack" else run_json

                    def measure(runner=runner, op=op, batch_size=batch_size) -> float:
                        return cfg.count / runner(server.url, op, batch_size, key_list, cfg.count)

                    summary = repeat_summary(cfg.runs, measure)
                    record(rows, results, f"statehouse {backend}", fmt, op, batch_size, 1, summary)
            for clients in cfg.clients:
                if clients == 1:
                    continue
                for op in ("put", "get"):
                    summary = repeat_summary(
                        cfg.runs, lambda op=op, b=batch_size, c=clients: run_concurrent(server.url, op, b, c, cfg.count)
                    )
                    record(rows, results, f"statehouse {backend}", "msgpack", op, batch_size, clients, summary)


# -- baselines ----------------------------------------------------------------------------


def bench_rocksdict(cfg: argparse.Namespace, rows: list[list[Any]], results: list[dict]) -> None:
    from rocksdict import Options, Rdict, WriteBatch

    path = tempfile.mkdtemp(prefix="statehouse-bench-rocksdict-")
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    db = Rdict(path, options)
    key_bytes = [k.encode() for k in keys(cfg.keys)]
    n = len(key_bytes)
    try:
        for batch_size in cfg.batch_sizes:

            def puts(batch_size=batch_size) -> float:
                started = time.perf_counter()
                for start in range(0, cfg.count, batch_size):
                    wb = WriteBatch(raw_mode=True)
                    for i in range(start, min(cfg.count, start + batch_size)):
                        wb.put(key_bytes[i % n], VALUE_BYTES_RAW)
                    db.write(wb)
                return cfg.count / (time.perf_counter() - started)

            def gets(batch_size=batch_size) -> float:
                started = time.perf_counter()
                for start in range(0, cfg.count, batch_size):
                    db.get([key_bytes[i % n] for i in range(start, min(cfg.count, start + batch_size))])
                return cfg.count / (time.perf_counter() - started)

            record(rows, results, "rocksdict in-process", "raw", "put", batch_size, 1, repeat_summary(cfg.runs, puts))
            record(rows, results, "rocksdict in-process", "raw", "get", batch_size, 1, repeat_summary(cfg.runs, gets))
    finally:
        db.close()
        shutil.rmtree(path, ignore_errors=True)


def bench_redis(cfg: argparse.Namespace, rows: list[list[Any]], results: list[dict]) -> bool:
    with redis_server() as port:
        if port is None:
            print("redis-server not on PATH: Redis baseline skipped")
            return False
        import redis

        r = redis.Redis(host="127.0.0.1", port=port)
        key_list = [k.encode() for k in keys(cfg.keys)]
        n = len(key_list)
        r.mset({k: VALUE_BYTES_RAW for k in key_list})

        def pipelined(command: str, batch_size: int) -> float:
            started = time.perf_counter()
            for start in range(0, cfg.count, batch_size):
                pipe = r.pipeline(transaction=False)
                for i in range(start, min(cfg.count, start + batch_size)):
                    key = key_list[i % n]
                    if command == "get":
                        pipe.get(key)
                    elif command == "put":
                        pipe.set(key, VALUE_BYTES_RAW)
                    elif command == "list_add":
                        pipe.rpush(b"l" + key, VALUE_BYTES_RAW)
                    else:
                        pipe.hset(b"m" + key, b"f", VALUE_BYTES_RAW)
                pipe.execute()
            return cfg.count / (time.perf_counter() - started)

        def multi(command: str, batch_size: int) -> float:
            started = time.perf_counter()
            for start in range(0, cfg.count, batch_size):
                chunk = [key_list[i % n] for i in range(start, min(cfg.count, start + batch_size))]
                if command == "get":
                    r.mget(chunk)
                else:
                    r.mset(dict.fromkeys(chunk, VALUE_BYTES_RAW))
            return cfg.count / (time.perf_counter() - started)

        for batch_size in cfg.batch_sizes:
            for op in cfg.ops:
                summary = repeat_summary(cfg.runs, lambda op=op, bs=batch_size: pipelined(op, bs))
                record(rows, results, "redis-py pipeline", "resp", op, batch_size, 1, summary)
            for op, name in (("get", "MGET"), ("put", "MSET")):
                summary = repeat_summary(cfg.runs, lambda op=op, bs=batch_size: multi(op, bs))
                record(rows, results, f"redis-py {name}", "resp", op, batch_size, 1, summary)
        r.flushall()
        r.close()
        return True


# -- reporting ----------------------------------------------------------------------------


def repeat_summary(runs: int, measure) -> Summary:
    return Summary([measure() for _ in range(runs)])


def record(rows, results, system: str, fmt: str, op: str, batch_size: int, clients: int, summary: Summary) -> None:
    rows.append([system, fmt, op, batch_size, clients, summary.fmt()])
    result = {"system": system, "format": fmt, "op": op, "batch": batch_size, "clients": clients}
    results.append({**result, "ops_per_s": summary.to_dict()})
    print(f"  {system:22} {fmt:8} {op:9} batch={batch_size:<5} clients={clients}: {summary.fmt()} ops/s", flush=True)


def ratios(results: list[dict]) -> list[str]:
    """The target ratios, from medians of this run."""

    def find(system: str, op: str, batch: int, fmt: str | None = None) -> float | None:
        for r in results:
            same = r["system"] == system and r["op"] == op and r["batch"] == batch and r["clients"] == 1
            if same and (fmt is None or r["format"] == fmt):
                return r["ops_per_s"]["median"]
        return None

    lines = []
    for batch in sorted({r["batch"] for r in results}):
        for op in ("put", "get"):
            ours = find("statehouse rocksdb", op, batch, "msgpack")
            heap = find("statehouse heap", op, batch, "msgpack")
            pipe = find("redis-py pipeline", op, batch)
            rdict = find("rocksdict in-process", op, batch)
            parts = [f"batch {batch} {op}: rocksdb {ours or 0:,.0f} ops/s"]
            if heap:
                parts.append(f"heap {heap:,.0f}")
            if ours and pipe:
                parts.append(f"{ours / pipe:.2f}x redis pipeline")
            if ours and rdict:
                parts.append(f"{ours / rdict:.0%} of rocksdict")
            lines.append(", ".join(parts))
    return lines


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--count", type=int, default=100_000, help="operations per measurement")
    p.add_argument("--keys", type=int, default=100_000, help="distinct keys")
    p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1000])
    p.add_argument("--ops", type=lambda s: [x for x in s.split(",") if x], default=list(OPS))
    p.add_argument("--formats", type=lambda s: [x for x in s.split(",") if x], default=["msgpack", "json"])
    p.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    p.add_argument("--backends", type=lambda s: [x for x in s.split(",") if x], default=["rocksdb", "heap"])
    p.add_argument("--baselines", type=lambda s: [x for x in s.split(",") if x], default=["rocksdict", "redis"])
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header("Batched keyed operations (ops/s, median of runs, min-max)")
    rows: list[list[Any]] = []
    results: list[dict] = []
    for backend in cfg.backends:
        bench_statehouse(backend, cfg, rows, results)
    if "rocksdict" in cfg.baselines:
        bench_rocksdict(cfg, rows, results)
    if "redis" in cfg.baselines:
        bench_redis(cfg, rows, results)
    print()
    print(table(["system", "format", "op", "batch", "clients", "ops/s median (min-max)"], rows))
    print()
    for line in ratios(results):
        print(line)
    save_json(cfg.json, {"benchmark": "batch_ops", "results": results})
    return {"results": results}


if __name__ == "__main__":
    main()
