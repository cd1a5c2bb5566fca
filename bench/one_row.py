"""What a one-row columnar put and get cost, two ways that load moves little:

* **engine**: the engine's own work in process (``ColumnOp.parse`` + ``perform`` + the answer
  table; heap), thread CPU µs per request, best of ``--runs`` rounds;
* **app**: the same requests through the whole ASGI app in process (its lifespan run, no server:
  the layers, the Arrow body read and the answer on top of the engine), thread CPU µs;
* **calls**: Python function calls per request of a live server (heap, started as
  ``python -m statehouse.app.serve`` is, under cProfile from its ``--requests`` requests after a
  warm-up; one kept-alive urllib3 connection), with where they are (by package).

``--before DIR`` measures the source tree ``DIR`` (``git worktree add /tmp/base <commit>``) the
same way, its rounds interleaved with this tree's (each round a fresh process per tree).

    .venv/bin/python -m bench.one_row [--before /tmp/base] [--runs 5] [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import urllib3

from bench.columnar import ARROW_STREAM, ipc
from bench.common import REPO, source_tree, wait_ready
from tests.support.server import free_port, stop_process

JOB, STATE, KEY = "bench", "v", "user-00001"
STATE_BODY = {"kind": "value", "value_type": "binary"}


def bodies(rows: int = 1) -> dict[str, bytes]:
    key = pa.array([KEY] if rows == 1 else [f"{KEY}-{i}" for i in range(rows)])
    return {"put": ipc({"key": key, "value": pa.array([b"x" * 32] * rows, pa.binary())}), "get": ipc({"key": key})}


def engine(requests: int, rows: int = 1) -> dict[str, float]:
    """Thread CPU µs per one-row (``rows``-row) put and get through the engine, in this process."""
    from statehouse.backends.attempts import perform
    from statehouse.backends.catalog import JobCatalog
    from statehouse.backends.columns import ColumnOp
    from statehouse.backends.heap.store import HeapStore
    from statehouse.snapshots.stored.descriptors import StateDescriptor

    catalog = JobCatalog(HeapStore())
    job, _ = catalog.create(JOB, 128)
    job.register_state(StateDescriptor(STATE, "value", value_type="binary"))
    tables = {op: pa.ipc.open_stream(body).read_all() for op, body in bodies(rows).items()}

    def one(op: str) -> None:
        work = ColumnOp.parse(STATE, op, tables[op])
        values = perform(job, work, size=100)
        if values is not None:
            work.answer(values)

    out = {}
    for op in ("put", "get"):
        for _ in range(200):
            one(op)
        start = time.thread_time()
        for _ in range(requests):
            one(op)
        out[op] = (time.thread_time() - start) / requests * 1e6
    catalog.close()
    return out


def app(requests: int, rows: int = 1) -> dict[str, float]:
    """Thread CPU µs per one-row (``rows``-row) put and get through the whole ASGI app (heap, its
    lifespan run, no server), in this process: an HTTP scope, the body in one message."""
    with tempfile.TemporaryDirectory(prefix="statehouse-bench-one-row-") as workdir:
        os.environ.update(STATEHOUSE_BACKEND="heap", STATEHOUSE_DATA_DIR=f"{workdir}/data")
        os.environ["STATEHOUSE_CHECKPOINT_DIR"] = f"{workdir}/checkpoints"
        from statehouse.app.main import create_app

        return asyncio.run(_app_requests(create_app(), requests, bodies(rows)))


async def _app_requests(asgi: Any, requests: int, body_of: dict[str, bytes]) -> dict[str, float]:
    async def call(method: str, path: str, body: bytes, content_type: bytes = b"application/json") -> int:
        headers = [(b"host", b"bench"), (b"content-type", content_type), (b"content-length", b"%d" % len(body))]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
            "state": {},
        }
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await asyncio.Event().wait()  # no disconnect while the request runs
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await asgi(scope, receive, send)
        return int(sent[0]["status"])

    startup: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await startup.put({"type": "lifespan.startup"})
    lifespan = asyncio.create_task(
        asgi({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, startup.get, events.put)
    )
    if (await events.get())["type"] != "lifespan.startup.complete":
        raise RuntimeError("the app did not start")
    for method, path, body in (
        ("PUT", f"/v1/jobs/{JOB}", b"{}"),
        ("PUT", f"/v1/jobs/{JOB}/states/{STATE}", json.dumps(STATE_BODY).encode()),
    ):
        if await call(method, path, body) >= 300:
            raise RuntimeError(f"{method} {path} failed")
    out = {}
    for op in ("put", "get"):
        path = f"/v1/jobs/{JOB}/states/{STATE}/columns/{op}"
        for _ in range(200):
            if await call("POST", path, body_of[op], ARROW_STREAM.encode()) != 200:
                raise RuntimeError(f"POST {path} failed")
        start = time.thread_time()
        for _ in range(requests):
            await call("POST", path, body_of[op], ARROW_STREAM.encode())
        out[op] = (time.thread_time() - start) / requests * 1e6
    await startup.put({"type": "lifespan.shutdown"})
    await events.get()
    await lifespan
    return out


def serve_profiled(port: int, stats: str) -> None:
    """The server of ``python -m statehouse.app.serve``, profiled from SIGUSR1 to SIGUSR2 (the
    stats then written to ``stats``)."""
    profiles: list[cProfile.Profile] = []

    def start(*_: Any) -> None:
        profiles.append(cProfile.Profile(time.thread_time))  # CPU, not waits; a new one per measurement
        profiles[-1].enable()

    def stop(*_: Any) -> None:
        profiles[-1].disable()
        profiles[-1].dump_stats(stats)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    from statehouse.app.serve import main

    main(["--host", "127.0.0.1", "--port", str(port)])


def _area(filename: str) -> str:
    """Where a profiled function is, coarsely (a package, or the Statehouse folder)."""
    for marker in ("site-packages/", "/lib/python3"):
        if marker in filename:
            rest = filename.split(marker, 1)[1].lstrip("/")
            return rest.split("/", 1)[0] if marker == "site-packages/" else "stdlib"
    parts = Path(filename).parts
    for folder in ("app", "backends", "stored", "keygroups", "protocol", "checkpointing", "errors"):
        if folder in parts:
            return "statehouse/" + "/".join(parts[parts.index(folder) : parts.index(folder) + 2])
    return "builtins" if filename == "~" else filename


def calls(requests: int, env: dict[str, str], keep: str | None = None, rows: int = 1) -> dict[str, Any]:
    """Python calls per request of a live server: one-row put, then get (each profiled alone);
    ``keep``: a path prefix the cProfile stats are copied to (``<keep>-put.prof``, ...)."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="statehouse-bench-one-row-") as workdir:
        port = free_port()
        full_env = {**os.environ, **env, "STATEHOUSE_BACKEND": "heap", "STATEHOUSE_DATA_DIR": f"{workdir}/data"}
        full_env["STATEHOUSE_CHECKPOINT_DIR"] = f"{workdir}/checkpoints"
        stats = f"{workdir}/stats"
        command = [sys.executable, "-m", "bench.one_row", "--serve-profiled", str(port), stats]
        server = subprocess.Popen(command, cwd=REPO, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, timeout=60)
            pool = urllib3.HTTPConnectionPool("127.0.0.1", port, maxsize=1, retries=False)
            json_body = {"content-type": "application/json"}
            for target, fields in ((f"/v1/jobs/{JOB}", {}), (f"/v1/jobs/{JOB}/states/{STATE}", STATE_BODY)):
                response = pool.urlopen("PUT", target, body=json.dumps(fields), headers=json_body)
                if response.status >= 300:
                    raise RuntimeError(f"PUT {target}: {response.status} {response.data[:300]!r}")
            for op, body in bodies(rows).items():
                target, headers = f"/v1/jobs/{JOB}/states/{STATE}/columns/{op}", {"content-type": ARROW_STREAM}
                for _ in range(300):  # warm-up: imports, caches, the first request's work
                    pool.urlopen("POST", target, body=body, headers=headers)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(stats)
                server.send_signal(signal.SIGUSR1)
                time.sleep(0.2)
                for _ in range(requests):
                    response = pool.urlopen("POST", target, body=body, headers=headers)
                    if response.status != 200:
                        raise RuntimeError(f"{target}: {response.status} {response.data[:300]!r}")
                server.send_signal(signal.SIGUSR2)
                deadline = time.monotonic() + 30
                while not os.path.exists(stats) and time.monotonic() < deadline:
                    pool.urlopen("GET", "/healthz")  # wakes the loop: the handler runs between callbacks
                    time.sleep(0.1)
                time.sleep(0.5)  # the dump finishes
                profile = pstats.Stats(stats)
                if keep:
                    profile.dump_stats(f"{keep}-{op}.prof")
                areas: Counter[str] = Counter()
                for (filename, _line, _name), (_cc, primitive, *_rest) in profile.stats.items():  # type: ignore[attr-defined]
                    areas[_area(filename)] += primitive
                out[op] = {
                    "calls": profile.total_calls / requests,  # type: ignore[attr-defined]
                    "areas": {area: n / requests for area, n in areas.most_common(12)},
                }
            pool.close()
        finally:
            stop_process(server)
    return out


def _engine_in(tree: str | None, requests: int, rows: int) -> dict[str, dict[str, float]]:
    """:func:`engine` and :func:`app` in a fresh process running ``tree``'s statehouse (this one's by default)."""
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(source_tree(tree)) if tree else {}
        command = [sys.executable, "-m", "bench.one_row", "--engine-only", str(requests), "--rows", str(rows)]
        done = subprocess.run(command, cwd=REPO, env={**os.environ, **env}, capture_output=True, check=True, text=True)
        return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="engine rounds per tree (a fresh process each)")
    p.add_argument("--requests", type=int, default=2_000, help="requests per measurement")
    p.add_argument("--rows", type=int, default=1, help="rows per request (1: the one-row request)")
    p.add_argument("--before", help="a source tree to measure the same way (before/after)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--stats", help="a directory to keep the live cProfile stats in (pstats files)")
    p.add_argument("--engine-only", type=int, help=argparse.SUPPRESS)
    p.add_argument("--serve-profiled", nargs=2, help=argparse.SUPPRESS)
    cfg = p.parse_args(argv)
    if cfg.engine_only:
        print(json.dumps({"engine": engine(cfg.engine_only, cfg.rows), "app": app(cfg.engine_only, cfg.rows)}))
        return {}
    if cfg.serve_profiled:
        serve_profiled(int(cfg.serve_profiled[0]), cfg.serve_profiled[1])
        return {}
    trees = {"after": None} | ({"before": cfg.before} if cfg.before else {})
    load = [os.getloadavg()[0]]
    print(f"load average (1 min) at start: {load[0]:.2f}", flush=True)
    rounds: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in trees}
    for n in range(cfg.runs):
        for name, tree in trees.items() if n % 2 == 0 else reversed(trees.items()):
            rounds[name].append(_engine_in(tree, cfg.requests, cfg.rows))
        load.append(os.getloadavg()[0])
    out: dict[str, Any] = {"benchmark": "one_row", "config": vars(cfg), "load": load, "calls": {}}
    for what, title in (("engine", "the engine"), ("app", "the whole app")):
        print(f"\n{title} in process (heap), thread CPU µs per request: median (min-max) of {cfg.runs} rounds")
        for name in trees:
            for op in ("put", "get"):
                xs = [r[what][op] for r in rounds[name]]
                found = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
                out.setdefault(what, {}).setdefault(name, {})[op] = found
                print(f"  {name:6} {op}: {found['median']:7.1f} ({found['min']:.1f}-{found['max']:.1f})")
    print("\nlive server (heap), Python function calls per request (cProfile):")
    for name, tree in trees.items():
        with contextlib.ExitStack() as stack:
            env = stack.enter_context(source_tree(tree)) if tree else {}
            if cfg.stats:
                Path(cfg.stats).mkdir(parents=True, exist_ok=True)
            keep = f"{cfg.stats}/{name}" if cfg.stats else None
            measured = out["calls"][name] = calls(cfg.requests, env, keep, cfg.rows)
        for op, found in measured.items():
            where = ", ".join(f"{area} {n:.0f}" for area, n in found["areas"].items())
            print(f"  {name:6} {op}: {found['calls']:.0f}  ({where})")
    load.append(os.getloadavg()[0])
    print(f"\nload average (1 min): {' -> '.join(f'{x:.2f}' for x in load)}")
    if cfg.json:
        Path(cfg.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
