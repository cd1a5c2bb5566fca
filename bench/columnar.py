"""Benchmark 8: the columnar endpoint against Redis MSET/MGET, in-process rocksdict and the row path.

One run measures everything, so that the ratios are fair on a shared machine: each measured
round runs every case once (the order reversed every other round), and ratios are taken per
round, then their median. 16-byte keys, 100-byte values, one replica per backend.

* **columnar client**: ``handle.put_many(keys, values)`` / ``handle.get_many(keys, as_arrow=True)``
  of ``statehouse.client`` on pre-built Arrow arrays, one request of ``rows`` rows per call
  (``max_batch_ops`` set to the largest size); ``get → pandas`` is the same read answered as a
  pandas Series (the default of ``get_many``).
* **columnar raw**: the same requests as pre-built Arrow IPC bodies POSTed with urllib3 (the
  answer read, not decoded): the server alone, the client's cost close to zero.
* **row batch**: the per-operation batch endpoint through the row-wise client
  (``job.batch(max_ops=rows)``: msgpack, one request per ``rows`` operations), the same rows.
* **Redis**: redis-py with hiredis, ``MSET`` / ``MGET`` of the same keys and values, one
  command per ``rows`` keys (skipped when ``redis-server`` is not on PATH).
* **rocksdict in-process**: what the RocksDB backend does for the same rows without Python
  around it: the same column family layout, keys pre-built as the backend stores them
  (1-byte key-group prefix, the 4-byte-length-prefixed UTF-8 key, a 4-byte-length-prefixed
  empty namespace), values msgpack-encoded as stored, one ``WriteBatch`` per request for put,
  one multi-get (``cf.get(list_of_keys)``) per request for get, raw mode, with the backend's
  RocksDB options (``db_options``: Bloom filters, the open-file bound).
* **request overhead**: server CPU per request of a one-row columnar put / get and of a bare
  ``GET /healthz`` (urllib3, pre-built bodies), beside the server CPU of a 1,000-row request.

Per case: ops/s (rows over the wall time), server CPU µs per row (the uvicorn or redis-server
process's CPU clock, every thread, read around the timed loop: /proc/<pid>/stat's utime+stime
at ns resolution) and client CPU µs per row (``time.process_time`` of this process, every
thread; for rocksdict that is all the work).

    .venv/bin/python -m bench.columnar --runs 5
    .venv/bin/python -m bench.columnar --quick      # smoke run, a few seconds
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import urllib3

from bench.common import (
    KEY_BYTES,
    REPO,
    VALUE_BYTES,
    Summary,
    keys,
    print_header,
    process_cpu_ns,
    redis_server,
    statehouse,
    table,
)
from bench.common import write_json as save_json
from statehouse.client import StatehouseClient
from statehouse.client.config import ClientConfig
from statehouse.protocol.keygroups.columnar import key_groups
from statehouse.snapshots.stored.codec import encode_primary
from statehouse.snapshots.stored.keys import key_group_prefix_width

JOB = "bench"
STATE = "v"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
BACKENDS = ("heap", "rocksdb")
ROW_PATH = "row batch (msgpack client)"


# -- the cases ------------------------------------------------------------------------------


@dataclass
class Case:
    """One thing measured: ``work()`` does ``ops`` operations (rows, or requests for the
    overhead cases); ``pid`` is the server whose CPU counts (``None``: in-process)."""

    system: str
    path: str
    op: str
    rows: int  # rows per request (1 for the overhead cases)
    ops: int
    work: Callable[[], Any]
    pid: int | None
    samples: list[dict[str, float]] = field(default_factory=list)

    @property
    def name(self) -> tuple[str, str, str, int]:
        return (self.system, self.path, self.op, self.rows)

    def measure(self) -> dict[str, float]:
        server_ns = process_cpu_ns(self.pid) if self.pid else 0
        cpu = time.process_time()
        started = time.perf_counter()
        self.work()
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu
        server = (process_cpu_ns(self.pid) - server_ns) / 1e9 if self.pid else 0.0
        return {"wall_s": wall, "client_cpu_s": cpu, "server_cpu_s": server}

    def summary(self, what: str) -> Summary:
        if what == "ops_per_s":
            return Summary([self.ops / s["wall_s"] for s in self.samples])
        return Summary([s[what] / self.ops * 1e6 for s in self.samples])  # µs per op


@dataclass
class Data:
    """Everything sent, built before any clock runs: per request size, ``chunks`` distinct
    requests' worth of keys; request ``j`` of a measurement uses chunk ``j % chunks``."""

    value: bytes | str
    arrow_type: pa.DataType
    key_strs: list[str]
    by_rows: dict[int, dict[str, list[Any]]] = field(default_factory=dict)

    @classmethod
    def build(cls, count_keys: int, sizes: list[int], value_type: str) -> Data:
        value: bytes | str = b"v" * VALUE_BYTES if value_type == "binary" else "v" * VALUE_BYTES
        arrow_type = pa.binary() if value_type == "binary" else pa.string()
        data = cls(value, arrow_type, keys(count_keys))
        for rows in sizes:
            chunks = [data.key_strs[i : i + rows] for i in range(0, count_keys - rows + 1, rows)]
            values = pa.array([value] * rows, arrow_type)
            arrow_keys = [pa.array(c, pa.string()) for c in chunks]
            data.by_rows[rows] = {
                "keys": chunks,
                "bytes": [[k.encode() for k in c] for c in chunks],
                "arrow": arrow_keys,
                "values": [values],
                "put_body": [ipc({"key": k, "value": values}) for k in arrow_keys],
                "get_body": [ipc({"key": k}) for k in arrow_keys],
            }
        return data


def ipc(columns: dict[str, pa.Array]) -> bytes:
    batch = pa.record_batch(list(columns.values()), names=list(columns))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def check(values: list[Any], expected: Any, what: str) -> None:
    wrong = sum(v != expected for v in values)
    if wrong or not values:
        raise AssertionError(f"{what}: {wrong} of {len(values)} values are not the value written")


def requests_for(count: int, rows: int) -> int:
    return max(1, count // rows)


def statehouse_cases(
    backend: str, url: str, pid: int, data: Data, cfg: argparse.Namespace, stack: contextlib.ExitStack
) -> list[Case]:
    client = stack.enter_context(StatehouseClient(ClientConfig(urls=(url,), max_batch_ops=max(cfg.rows))))
    job = client.create_job(JOB)
    handle = job.register(STATE, "value", value_type=cfg.value_type)
    host, port = url.removeprefix("http://").split(":")
    pool = stack.enter_context(urllib3.HTTPConnectionPool(host, int(port), maxsize=1, retries=False))
    path = f"/v1/jobs/{JOB}/states/{STATE}/columns"
    headers = {"content-type": ARROW_STREAM}
    for rows in cfg.rows:  # every key once, so that reads find values (and the RocksDB files exist)
        for chunk in data.by_rows[rows]["arrow"]:
            handle.put_many(chunk, data.by_rows[rows]["values"][0])
    # What is timed reads what was written, on every path (checked once, not timed).
    first = data.by_rows[min(cfg.rows)]
    check(handle.get_many(first["arrow"][0], as_arrow=True).to_pylist(), data.value, f"{backend} columnar get")
    with job.batch() as batch:
        pending = [batch.get(STATE, key) for key in first["keys"][0]]
    check([p.value for p in pending], data.value, f"{backend} row batch get")
    system = f"statehouse {backend}"
    cases = []
    for rows in cfg.rows:
        d = data.by_rows[rows]
        n, nreq, nrow = len(d["keys"]), requests_for(cfg.count, rows), requests_for(cfg.row_count, rows)
        values = d["values"][0]

        def client_put(d=d, n=n, nreq=nreq, values=values) -> None:
            arrow = d["arrow"]
            for j in range(nreq):
                handle.put_many(arrow[j % n], values)

        def client_get(d=d, n=n, nreq=nreq) -> None:
            arrow = d["arrow"]
            for j in range(nreq):
                handle.get_many(arrow[j % n], as_arrow=True)

        def client_get_pandas(d=d, n=n, nreq=nreq) -> None:
            arrow = d["arrow"]
            for j in range(nreq):
                handle.get_many(arrow[j % n])

        def raw(op: str, d=d, n=n, nreq=nreq) -> None:
            bodies, url_op = d[f"{op}_body"], f"{path}/{op}"
            for j in range(nreq):
                response = pool.urlopen("POST", url_op, body=bodies[j % n], headers=headers)
                if response.status != 200:
                    raise RuntimeError(f"{url_op}: {response.status} {response.data[:300]!r}")

        def row_batch(op: str, d=d, n=n, nrow=nrow, rows=rows) -> None:
            chunks, value = d["keys"], data.value
            with job.batch(max_ops=rows) as batch:
                if op == "put":
                    for j in range(nrow):
                        for key in chunks[j % n]:
                            batch.put(STATE, key, value)
                else:
                    for j in range(nrow):
                        for key in chunks[j % n]:
                            batch.get(STATE, key)

        ops = nreq * rows
        cases += [
            Case(system, "columnar client", "put", rows, ops, client_put, pid),
            Case(system, "columnar client", "get", rows, ops, client_get, pid),
            Case(system, "columnar client", "get → pandas", rows, ops, client_get_pandas, pid),
            Case(system, "columnar raw (urllib3)", "put", rows, ops, functools.partial(raw, "put"), pid),
            Case(system, "columnar raw (urllib3)", "get", rows, ops, functools.partial(raw, "get"), pid),
            Case(system, ROW_PATH, "put", rows, nrow * rows, functools.partial(row_batch, "put"), pid),
            Case(system, ROW_PATH, "get", rows, nrow * rows, functools.partial(row_batch, "get"), pid),
        ]
    # Request overhead: one-row columnar requests and a bare /healthz, pre-built, over urllib3.
    one_put = ipc({"key": pa.array(data.key_strs[:1]), "value": pa.array([data.value], data.arrow_type)})
    one_get = ipc({"key": pa.array(data.key_strs[:1])})

    def requests(method: str, target: str, body: bytes | None) -> None:
        for _ in range(cfg.overhead_requests):
            response = pool.urlopen(method, target, body=body, headers=headers if body else None)
            if response.status != 200:
                raise RuntimeError(f"{target}: {response.status} {response.data[:300]!r}")

    for op, method, target, body in (
        ("GET /healthz", "GET", "/healthz", None),
        ("put, 1 row", "POST", f"{path}/put", one_put),
        ("get, 1 row", "POST", f"{path}/get", one_get),
    ):
        work = functools.partial(requests, method, target, body)
        cases.append(Case(system, "request overhead", op, 1, cfg.overhead_requests, work, pid))
    return cases


def redis_cases(port: int, data: Data, cfg: argparse.Namespace, stack: contextlib.ExitStack) -> list[Case]:
    import redis

    r = redis.Redis(host="127.0.0.1", port=port)
    stack.callback(r.close)
    pid = int(r.info("server")["process_id"])
    value = data.value if isinstance(data.value, bytes) else data.value.encode()
    cases = []
    for rows in cfg.rows:
        chunks = data.by_rows[rows]["bytes"]
        n, nreq = len(chunks), requests_for(cfg.count, rows)
        for chunk in chunks:
            r.mset(dict.fromkeys(chunk, value))
        check(r.mget(chunks[0]), value, "redis MGET")

        def mset(chunks=chunks, n=n, nreq=nreq) -> None:
            for j in range(nreq):
                r.mset(dict.fromkeys(chunks[j % n], value))

        def mget(chunks=chunks, n=n, nreq=nreq) -> None:
            for j in range(nreq):
                r.mget(chunks[j % n])

        cases += [
            Case("redis-py (hiredis)", "MSET", "put", rows, nreq * rows, mset, pid),
            Case("redis-py (hiredis)", "MGET", "get", rows, nreq * rows, mget, pid),
        ]
    return cases


def rocksdict_cases(
    data: Data, cfg: argparse.Namespace, max_parallelism: int, stack: contextlib.ExitStack
) -> list[Case]:
    from rocksdict import Rdict, WriteBatch

    from statehouse.backends.rocksdb.database import db_options

    if key_group_prefix_width(max_parallelism) != 1:
        raise SystemExit(f"max_parallelism {max_parallelism}: this baseline builds 1-byte key-group prefixes")
    directory = tempfile.mkdtemp(prefix="statehouse-bench-rocksdict-")
    stack.callback(shutil.rmtree, directory, True)
    # The backend's own options (Bloom filters, the open-file bound): the same RocksDB work.
    db = Rdict(directory, db_options(), column_families={STATE: db_options()})
    stack.callback(db.close)
    family, handle = db.get_column_family(STATE), db.get_column_family_handle(STATE)
    record = msgpack.packb(data.value, use_bin_type=True)  # as codec.encode_value stores it
    cases = []
    for rows in cfg.rows:
        stored = []
        for chunk in data.by_rows[rows]["arrow"]:  # the RocksDB backend's stored keys, built up front
            groups = key_groups(chunk, "string", max_parallelism).tolist()
            pairs = zip(groups, chunk.to_pylist(), strict=True)
            stored.append([bytes([g]) + encode_primary(k, "string", "") for g, k in pairs])
        n, nreq = len(stored), requests_for(cfg.count, rows)
        for chunk_keys in stored:
            batch = WriteBatch(raw_mode=True)
            for key in chunk_keys:
                batch.put(key, record, handle)
            db.write(batch)
        check(family.get(stored[0]) or [], record, "rocksdict multi-get")

        def puts(stored=stored, n=n, nreq=nreq) -> None:
            for j in range(nreq):
                batch = WriteBatch(raw_mode=True)
                put = batch.put
                for key in stored[j % n]:
                    put(key, record, handle)
                db.write(batch)

        def gets(stored=stored, n=n, nreq=nreq) -> None:
            for j in range(nreq):
                family.get(stored[j % n])

        def point_gets(stored=stored, n=n, nreq=nreq) -> None:
            get = family.get
            for j in range(nreq):
                list(map(get, stored[j % n]))

        cases += [
            Case("rocksdict in-process", "WriteBatch, raw", "put", rows, nreq * rows, puts, None),
            Case("rocksdict in-process", "multi-get, raw", "get", rows, nreq * rows, gets, None),
            # What RocksDBPartition.get_many does (point gets in a C loop), for comparison.
            Case("rocksdict in-process", "point gets, raw", "get", rows, nreq * rows, point_gets, None),
        ]
    return cases


@contextlib.contextmanager
def all_cases(cfg: argparse.Namespace, data: Data) -> Iterator[tuple[list[Case], list[str]]]:
    """Every server up at once (idle ones cost nothing), and the cases that use them."""
    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        cases: list[Case] = []
        max_parallelism = 128
        for backend in cfg.backends:
            server = stack.enter_context(statehouse(backend))
            cases += statehouse_cases(backend, server.url, server.process.pid, data, cfg, stack)
        if "redis" in cfg.baselines:
            port = stack.enter_context(redis_server())
            if port is None:
                notes.append("redis-server not on PATH: the Redis baseline was skipped")
            else:
                cases += redis_cases(port, data, cfg, stack)
        if "rocksdict" in cfg.baselines:
            cases += rocksdict_cases(data, cfg, max_parallelism, stack)
        yield cases, notes


# -- reporting ------------------------------------------------------------------------------


def find(cases: list[Case], system: str, path: str, op: str, rows: int) -> Case | None:
    return next((c for c in cases if c.name == (system, path, op, rows)), None)


def paired(a: Case | None, b: Case | None, what: str = "ops_per_s") -> Summary | None:
    """``a / b`` per round (both measured in it), so drift between rounds cancels."""
    if a is None or b is None or not a.samples or not b.samples:
        return None
    if what == "ops_per_s":
        pairs = [(a.ops / x["wall_s"]) / (b.ops / y["wall_s"]) for x, y in zip(a.samples, b.samples, strict=True)]
    else:  # CPU per op: b's over a's, so that > 1 means a is cheaper
        pairs = [
            (y["server_cpu_s"] + y["client_cpu_s"]) / b.ops / ((x["server_cpu_s"] + x["client_cpu_s"]) / a.ops)
            for x, y in zip(a.samples, b.samples, strict=True)
        ]
    return Summary(pairs)


def result_rows(cases: list[Case]) -> list[list[Any]]:
    rows = []
    for c in cases:
        server = c.summary("server_cpu_s").fmt(digits=2) if c.pid else "-"
        unit = "req" if c.path == "request overhead" else "op"
        client = c.summary("client_cpu_s").fmt(digits=2)
        ops = c.summary("ops_per_s").fmt() + (" req/s" if unit == "req" else "")
        rows.append([c.system, c.path, c.op, f"{c.rows:,}", ops, server, client])
    return rows


def ratio_rows(cases: list[Case], cfg: argparse.Namespace) -> list[list[Any]]:
    """Against the targets: heap columnar vs Redis, RocksDB columnar vs rocksdict, columnar vs rows."""
    out: list[list[Any]] = []

    def add(label: str, target: float | None, ours: Case | None, raw: Case | None, base: Case | None) -> None:
        ratio = paired(ours, base)
        if ratio is None:
            return
        status = "-" if target is None else ("met" if ratio.median >= target else "**missed**")
        raw_ratio, cpu = paired(raw, base), paired(ours, base, "cpu")
        raw_cell = raw_ratio.fmt(digits=2, unit="x") if raw_ratio is not None else "-"
        cpu_cell = cpu.fmt(digits=2, unit="x") if cpu is not None else "-"
        want = f">= {target:.1f}x" if target is not None else "-"
        out.append([label, want, ratio.fmt(digits=2, unit="x"), raw_cell, cpu_cell, status])

    for rows in cfg.rows:
        redis_target = 1.0 if rows >= 10_000 else 0.8
        for op, command in (("put", "MSET"), ("get", "MGET")):
            base = find(cases, "redis-py (hiredis)", command, op, rows)
            ours = find(cases, "statehouse heap", "columnar client", op, rows)
            raw = find(cases, "statehouse heap", "columnar raw (urllib3)", op, rows)
            add(f"heap columnar {op} / Redis {command}, {rows:,} rows", redis_target, ours, raw, base)
    for rows in cfg.rows:
        for op, path in (("put", "WriteBatch, raw"), ("get", "multi-get, raw"), ("get", "point gets, raw")):
            base = find(cases, "rocksdict in-process", path, op, rows)
            ours = find(cases, "statehouse rocksdb", "columnar client", op, rows)
            raw = find(cases, "statehouse rocksdb", "columnar raw (urllib3)", op, rows)
            target = 0.9 if rows >= 10_000 and path != "point gets, raw" else None
            add(f"rocksdb columnar {op} / rocksdict {path}, {rows:,} rows", target, ours, raw, base)
    for backend in cfg.backends:
        for rows in cfg.rows:
            for op in ("put", "get"):
                base = find(cases, f"statehouse {backend}", ROW_PATH, op, rows)
                ours = find(cases, f"statehouse {backend}", "columnar client", op, rows)
                raw = find(cases, f"statehouse {backend}", "columnar raw (urllib3)", op, rows)
                add(f"{backend} columnar {op} / row batch, {rows:,} rows", None, ours, raw, base)
    return out


def overhead_lines(cases: list[Case], cfg: argparse.Namespace) -> list[str]:
    """Fixed server CPU per request against what a 1,000-row request costs in all."""
    lines = []
    rows = 1_000 if 1_000 in cfg.rows else min(cfg.rows)
    for backend in cfg.backends:
        system = f"statehouse {backend}"
        health = find(cases, system, "request overhead", "GET /healthz", 1)
        parts = []
        for op in ("put", "get"):
            one = find(cases, system, "request overhead", f"{op}, 1 row", 1)
            full = find(cases, system, "columnar raw (urllib3)", op, rows)
            if one is None or full is None or health is None:
                continue
            per_request = one.summary("server_cpu_s").median
            whole = full.summary("server_cpu_s").median * rows
            parts.append(
                f"{op}: 1-row request {per_request:,.0f} µs, a {rows:,}-row request {whole:,.0f} µs "
                f"(fixed share {per_request / whole:.0%})"
            )
        if health is not None:
            lines.append(
                f"{system}: server CPU per request, GET /healthz {health.summary('server_cpu_s').median:,.0f} µs; "
                + "; ".join(parts)
            )
    return lines


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def uncommitted() -> list[str]:
    """Files of the server and client that differ from the commit printed (the tree is what runs)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ["(git status failed)"]
    return [line[3:] for line in out.splitlines() if line[3:] and not line[3:].startswith("bench/")]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="measured rounds (every case once per round)")
    p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[1_000, 10_000])
    p.add_argument("--count", type=int, default=400_000, help="rows per measurement (columnar, Redis, rocksdict)")
    p.add_argument("--row-count", type=int, default=100_000, help="rows per measurement of the row batch path")
    p.add_argument("--keys", type=int, default=100_000, help="distinct keys (a multiple of every --rows)")
    p.add_argument("--overhead-requests", type=int, default=2_000, help="requests per request-overhead case")
    p.add_argument("--value-type", choices=("binary", "string"), default="binary", help="the state's value_type")
    p.add_argument("--backends", type=lambda s: [x for x in s.split(",") if x], default=list(BACKENDS))
    p.add_argument("--baselines", type=lambda s: [x for x in s.split(",") if x], default=["redis", "rocksdict"])
    p.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted")
    p.add_argument("--quick", action="store_true", help="smoke run: 1,000 rows per request, small counts, 1 round")
    p.add_argument("--json", help="write the results here")
    cfg = p.parse_args(argv)
    if cfg.quick:
        cfg.rows, cfg.count, cfg.row_count, cfg.keys = [1_000], 5_000, 2_000, 5_000
        cfg.overhead_requests, cfg.runs, cfg.warmup = 50, 1, 1
    bad = [r for r in cfg.rows if r < 1 or cfg.keys % r]
    if bad:
        p.error(f"--keys {cfg.keys} must be a positive multiple of every --rows (not {bad})")
    return cfg


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header("Columnar endpoint against Redis MSET/MGET, in-process rocksdict and the row path")
    extra = {p: _version(p) for p in ("pyarrow", "numpy", "pandas", "urllib3")}
    print(f"also: {extra}, {KEY_BYTES}-byte keys, {VALUE_BYTES}-byte values ({cfg.value_type})")
    dirty = uncommitted()
    print("uncommitted changes in the tree measured: " + (", ".join(dirty) if dirty else "none"))
    load = os.getloadavg()[0]
    print(f"load average (1 min) at start: {load:.2f}", flush=True)
    data = Data.build(cfg.keys, cfg.rows, cfg.value_type)
    with all_cases(cfg, data) as (cases, notes):
        for note in notes:
            print(note)
        for _ in range(cfg.warmup):  # connections, caches, memtables: measured, not kept
            for case in cases:
                case.measure()
        for n in range(cfg.runs):
            for case in cases if n % 2 == 0 else cases[::-1]:
                case.samples.append(case.measure())
            print(f"  round {n + 1}/{cfg.runs} done", flush=True)
    end_load = os.getloadavg()[0]
    print(f"load average (1 min) at end: {end_load:.2f}")
    print()
    headers = ["system", "path", "op", "rows/request", "ops/s", "server CPU µs/op", "client CPU µs/op"]
    print(table(headers, result_rows(cases)))
    print()
    ratios = ratio_rows(cases, cfg)
    headers = ["ratio (paired per round)", "target", "ops/s: client path", "ops/s: raw (server only)"]
    print(table([*headers, "CPU/op: base ÷ client path", "status"], ratios))
    print()
    for line in overhead_lines(cases, cfg):
        print(line)
    for note in notes:
        print(note)
    results = [
        {
            "system": c.system,
            "path": c.path,
            "op": c.op,
            "rows": c.rows,
            "ops": c.ops,
            "ops_per_s": c.summary("ops_per_s").to_dict(),
            "server_cpu_us_per_op": c.summary("server_cpu_s").to_dict() if c.pid else None,
            "client_cpu_us_per_op": c.summary("client_cpu_s").to_dict(),
            "samples": c.samples,
        }
        for c in cases
    ]
    out = {"benchmark": "columnar", "config": vars(cfg), "load": [load, end_load], "uncommitted": dirty}
    out["results"] = results
    out["ratios"] = ratios
    out["command"] = " ".join([Path(sys.executable).name, *sys.argv])
    save_json(cfg.json, out)
    return out


if __name__ == "__main__":
    main()
