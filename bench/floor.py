"""The data plane's per-request cost against the floor of its own server stack.

In one run, rounds interleaved (every case once per round, the order reversed every other round):

* **bare ASGI**: ``bench/bare_asgi.py`` on the exact stack ``python -m statehouse.app.serve``
  runs (uvicorn, httptools with the HTTP limits, uvloop): a POST of a one-row columnar put's
  body, read whole and answered with a small JSON body; its access log off. No application can
  cost less on this server.
* **Statehouse** (heap backend, started as everywhere, access log at its default): a one-row
  columnar put and get, a one-get JSON batch, ``GET /healthz``, and a 1,000-row columnar get through the client
  (``get_many(as_arrow=True)``), beside **Redis MGET** of the same 1,000 keys (redis-py, hiredis).
* ``--before DIR``: the same Statehouse cases against a second server run from the source tree
  ``DIR`` (e.g. ``git worktree add /tmp/base <commit>``), in the same rounds: before/after.

Per request: the server's CPU µs (the server process's own CPU clock around the timed loop, every
thread). One kept-alive urllib3 connection, requests back to back. Ratios are paired per round,
then the median.

    .venv/bin/python -m bench.floor --runs 5 [--before /tmp/base] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import urllib3

from bench.columnar import ARROW_STREAM, Case, Data, find, ipc, paired, uncommitted
from bench.common import (
    REPO,
    Summary,
    print_header,
    redis_server,
    source_tree,
    statehouse,
    table,
    wait_ready,
    write_json,
)
from statehouse.client import StatehouseClient
from statehouse.client.config import ClientConfig
from tests.support.server import free_port, stop_process

JOB, STATE = "bench", "v"
BARE = "bare ASGI (serve stack)"
REDIS = "redis-py (hiredis)"
ROWS = 1_000
BATCH_GET = b'{"ops": [{"op": "get", "state": "v", "key": "k-0"}]}'


@contextlib.contextmanager
def bare_server() -> Iterator[tuple[str, int]]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.bare_asgi", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, timeout=30)
        yield url, process.pid
    finally:
        stop_process(process)


def one_row(data: Data) -> tuple[bytes, bytes]:
    """A one-row columnar put's body and a one-row get's."""
    key, value = pa.array(data.key_strs[:1]), pa.array([data.value], data.arrow_type)
    return ipc({"key": key, "value": value}), ipc({"key": key})


def requests_case(
    system: str,
    op: str,
    pool: urllib3.HTTPConnectionPool,
    target: str,
    body: bytes | None,
    count: int,
    pid: int,
    content_type: str = ARROW_STREAM,
) -> Case:
    headers = {"content-type": content_type} if body is not None else None

    def work() -> None:
        for _ in range(count):
            response = pool.urlopen("POST" if body is not None else "GET", target, body=body, headers=headers)
            if response.status != 200:
                raise RuntimeError(f"{target}: {response.status} {response.data[:300]!r}")

    return Case(system, "request", op, 1, count, work, pid)


def statehouse_cases(
    system: str, url: str, pid: int, data: Data, cfg: argparse.Namespace, stack: contextlib.ExitStack
) -> list[Case]:
    client = stack.enter_context(StatehouseClient(ClientConfig(urls=(url,), max_batch_ops=ROWS)))
    job = client.create_job(JOB)
    handle = job.register(STATE, "value", value_type="binary")
    chunks = data.by_rows[ROWS]["arrow"]
    values = data.by_rows[ROWS]["values"][0]
    for chunk in chunks:
        handle.put_many(chunk, values)
    host, port = url.removeprefix("http://").split(":")
    pool = stack.enter_context(urllib3.HTTPConnectionPool(host, int(port), maxsize=1, retries=False))
    path = f"/v1/jobs/{JOB}/states/{STATE}/columns"
    put_body, get_body = one_row(data)
    n, nreq = len(chunks), max(1, cfg.count // ROWS)

    def get_many() -> None:
        for j in range(nreq):
            handle.get_many(chunks[j % n], as_arrow=True)

    count = cfg.requests
    return [
        requests_case(system, "put, 1 row", pool, f"{path}/put", put_body, count, pid),
        requests_case(system, "get, 1 row", pool, f"{path}/get", get_body, count, pid),
        requests_case(system, "batch, 1 get", pool, f"/v1/jobs/{JOB}/batch", BATCH_GET, count, pid, "application/json"),
        requests_case(system, "GET /healthz", pool, "/healthz", None, count, pid),
        Case(system, "columnar client", "get", ROWS, nreq * ROWS, get_many, pid),
    ]


def redis_case(port: int, data: Data, cfg: argparse.Namespace, stack: contextlib.ExitStack) -> Case:
    import redis

    r = redis.Redis(host="127.0.0.1", port=port)
    stack.callback(r.close)
    chunks = data.by_rows[ROWS]["bytes"]
    value = data.value if isinstance(data.value, bytes) else data.value.encode()
    for chunk in chunks:
        r.mset(dict.fromkeys(chunk, value))
    n, nreq = len(chunks), max(1, cfg.count // ROWS)

    def mget() -> None:
        for j in range(nreq):
            r.mget(chunks[j % n])

    return Case(REDIS, "MGET", "get", ROWS, nreq * ROWS, mget, int(r.info("server")["process_id"]))


@contextlib.contextmanager
def all_cases(cfg: argparse.Namespace, data: Data) -> Iterator[tuple[list[Case], list[str]]]:
    systems = {"statehouse": None} | ({"statehouse before": cfg.before} if cfg.before else {})
    with contextlib.ExitStack() as stack:
        url, pid = stack.enter_context(bare_server())
        pool = stack.enter_context(urllib3.HTTPConnectionPool("127.0.0.1", int(url.rsplit(":", 1)[1]), maxsize=1))
        cases = [requests_case(BARE, "POST, 1-row put body", pool, "/", one_row(data)[0], cfg.requests, pid)]
        for system, tree in systems.items():
            env = stack.enter_context(source_tree(tree)) if tree else {}
            server = stack.enter_context(statehouse("heap", env=env))
            cases += statehouse_cases(system, server.url, server.process.pid, data, cfg, stack)
        notes = []
        port = stack.enter_context(redis_server())
        if port is None:
            notes.append("redis-server not on PATH: the Redis baseline was skipped")
        else:
            cases.append(redis_case(port, data, cfg, stack))
        yield cases, notes


def ratio_rows(cases: list[Case], systems: list[str]) -> list[list[Any]]:
    bare = find(cases, BARE, "request", "POST, 1-row put body", 1)
    mget = find(cases, REDIS, "MGET", "get", ROWS)
    out = []
    for system in systems:
        for op in ("put, 1 row", "get, 1 row", "batch, 1 get", "GET /healthz"):
            ours = find(cases, system, "request", op, 1)
            if ours is None or bare is None or not ours.samples:
                continue
            per_round = [x["server_cpu_s"] / y["server_cpu_s"] for x, y in zip(ours.samples, bare.samples, strict=True)]
            ratio = Summary(per_round)
            target = "<= 1.5x" if op in ("put, 1 row", "get, 1 row") else "-"
            status = "-" if target == "-" else ("met" if ratio.median <= 1.5 else "**missed**")
            out.append([f"{system}: {op} / bare ASGI, server CPU", target, ratio.fmt(digits=2, unit="x"), status])
        ours = find(cases, system, "columnar client", "get", ROWS)
        by_rate, by_cpu = paired(ours, mget), paired(ours, mget, "cpu")
        if by_rate is not None and by_cpu is not None:
            status = "met" if max(by_rate.median, by_cpu.median) >= 0.8 else "**missed**"
            cells = f"{by_rate.fmt(digits=2, unit='x')} (ops/s); {by_cpu.fmt(digits=2, unit='x')} (CPU)"
            out.append([f"{system}: heap get / Redis MGET, {ROWS:,} rows", ">= 0.8x", cells, status])
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="measured rounds (every case once per round)")
    p.add_argument("--requests", type=int, default=3_000, help="requests per one-row case")
    p.add_argument("--count", type=int, default=300_000, help="rows per 1,000-row get measurement")
    p.add_argument("--before", help="a source tree to run a second Statehouse server from (before/after)")
    p.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted")
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header("The data plane's per-request floor")
    dirty = uncommitted()
    print("uncommitted changes in the tree measured: " + (", ".join(dirty) if dirty else "none"))
    if cfg.before:
        print(f"before: {cfg.before}")
    load = [os.getloadavg()[0]]
    print(f"load average (1 min) at start: {load[0]:.2f}", flush=True)
    data = Data.build(100 * ROWS, [ROWS], "binary")
    measure: Callable[[Case], dict[str, float]] = Case.measure
    with all_cases(cfg, data) as (cases, notes):
        for _ in range(cfg.warmup):
            for case in cases:
                measure(case)
        for n in range(cfg.runs):
            for case in cases if n % 2 == 0 else cases[::-1]:
                case.samples.append(measure(case))
                time.sleep(0.05)
            load.append(os.getloadavg()[0])
            print(f"  round {n + 1}/{cfg.runs} done, load {load[-1]:.2f}", flush=True)
    print()
    rows = []
    for c in cases:
        unit = "request" if c.path == "request" else "row"
        server = c.summary("server_cpu_s").fmt(digits=2 if unit == "row" else 0)
        client = c.summary("client_cpu_s").fmt(digits=2 if unit == "row" else 0)
        rows.append([c.system, c.op, f"{c.rows:,}", c.summary("ops_per_s").fmt(), f"{server} /{unit}", client])
    print(table(["system", "request", "rows", "ops/s", "server CPU µs", "client CPU µs"], rows))
    print()
    systems = ["statehouse"] + (["statehouse before"] if cfg.before else [])
    ratios = ratio_rows(cases, systems)
    print(table(["ratio (paired per round)", "target", "median (min-max)", "status"], ratios))
    for note in notes:
        print(note)
    out = {"benchmark": "floor", "config": vars(cfg), "load": load, "uncommitted": dirty, "ratios": ratios}
    out["results"] = [
        {
            "system": c.system,
            "op": c.op,
            "rows": c.rows,
            "ops_per_s": c.summary("ops_per_s").to_dict(),
            "server_cpu_us": c.summary("server_cpu_s").to_dict(),
            "client_cpu_us": c.summary("client_cpu_s").to_dict(),
        }
        for c in cases
    ]
    write_json(cfg.json, out)
    return out


if __name__ == "__main__":
    main()
