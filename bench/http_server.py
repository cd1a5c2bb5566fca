"""Benchmark 12: what the HTTP server's own limits cost per request (app/serve.py).

The same application under plain ``uvicorn statehouse.app.main:app`` (httptools, uvloop: no head
size or read-time bound, no connection cap) and under ``python -m statehouse.app.serve`` (the same
uvicorn protocol plus those bounds: a byte count per chunk while a head arrives, one timer per
request phase, a connection count). Closed loop over 16 kept-alive connections; per run the
server's CPU µs per request (its process CPU clock around the timed loop) and requests/s. Runs
alternate between the two servers so that drift on a shared machine hits both.

    .venv/bin/python -m bench.http_server --runs 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import Summary, print_header, process_cpu_ns, table, wait_ready, write_json
from bench.loadgen import http_request, run_load
from tests.support.server import REPO, free_port

SERVERS = {
    "uvicorn (plain)": ["-m", "uvicorn", "statehouse.app.main:app"],
    "statehouse.app.serve (limits)": ["-m", "statehouse.app.serve"],
}
CASES = {
    "GET /healthz": lambda: lambda i: HEALTH,
    "PUT one key": lambda: lambda i: PUTS[i % len(PUTS)],
}
HEALTH = http_request("GET", "/healthz")
PUTS = [
    http_request("PUT", f"/v1/jobs/bench/states/v/keys/k{i}", orjson.dumps({"value": {"n": i}})) for i in range(1000)
]


def start(command: list[str], workdir: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "STATEHOUSE_BACKEND": "heap", "STATEHOUSE_DATA_DIR": workdir}
    process = subprocess.Popen(
        [sys.executable, *command, "--port", str(port), "--no-access-log"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, timeout=30)
    with httpx.Client(base_url=url) as http:
        http.put("/v1/jobs/bench").raise_for_status()
        http.put("/v1/jobs/bench/states/v", json={"kind": "value"}).raise_for_status()
    return process, url


def measure(url: str, pid: int, case: str, requests: int) -> tuple[float, float]:
    """(server CPU µs per request, requests/s) of one closed-loop run."""
    make = CASES[case]()
    run_load(url, make, requests // 10, connections=16)  # warm up
    cpu = process_cpu_ns(pid)
    result = run_load(url, make, requests, connections=16)
    assert result.errors == 0
    return (process_cpu_ns(pid) - cpu) / 1000 / requests, result.throughput


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--json", help="write the results here")
    cfg = parser.parse_args(argv)
    print_header("HTTP server limits: CPU per request")
    cpu: dict[tuple[str, str], list[float]] = {}
    rate: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="statehouse-bench-http-") as workdir:
        started = {name: start(command, str(Path(workdir) / name.split()[0])) for name, command in SERVERS.items()}
        try:
            for run in range(cfg.runs):
                for case in CASES:
                    order = list(started.items())
                    for name, (process, url) in order if run % 2 == 0 else reversed(order):  # neither always first
                        us, per_s = measure(url, process.pid, case, cfg.requests)
                        cpu.setdefault((name, case), []).append(us)
                        rate.setdefault((name, case), []).append(per_s)
                        time.sleep(0.2)
        finally:
            for process, _url in started.values():
                process.terminate()
                process.wait(15)
    rows, results = [], []
    for case in CASES:
        base = cpu[(next(iter(SERVERS)), case)]
        for name in SERVERS:
            c, r = Summary(cpu[(name, case)]), Summary(rate[(name, case)])
            # paired per run (the two servers measured back to back), so drift between runs cancels
            ratio = Summary([x / y for x, y in zip(cpu[(name, case)], base, strict=True)])
            rows.append([name, case, c.fmt(digits=0), ratio.fmt(digits=2), r.fmt(digits=0)])
            results.append({"server": name, "case": case, "cpu_us": c.to_dict(), "req_per_s": r.to_dict()})
    print(table(["server", "request", "server CPU µs/request", "ratio to plain (paired)", "req/s (16 conns)"], rows))
    out = {"runs": cfg.runs, "requests": cfg.requests, "results": results}
    write_json(cfg.json, out)
    return out


if __name__ == "__main__":
    main()
