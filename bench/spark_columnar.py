"""Benchmark 9: a Spark micro-batch job keeping per-user sum and count state, three ways.

The same input (Parquet files of ``user_id`` and ``amount``, one file per micro-batch), the
same machine, the same run. Each micro-batch updates every user's running ``total`` (sum of
amounts) and ``events`` (count) exactly once and writes the touched users' new values to
Spark's ``noop`` sink:

* **columnar**: ``exactly_once`` + ``df.repartition("user_id").mapInPandas`` with
  ``with_state_pandas`` (the pattern of ``pipelines/user_features_columnar.py``): per Arrow
  batch the events are grouped by user with pandas (sum, size) and sent as one columnar
  ``add`` per state; when the partition is done, one columnar ``get`` per state reads its
  users. Two reducing ``sum`` states, ``value_type`` float64 and int64.
* **columnar, every row** (``columnar-rows``): the same without the pandas grouping: every
  event is a row of both ``add`` requests (the server folds a user's rows in order), as the
  user-features job sends its sums.
* **grouped** (``--paths grouped``; not among the defaults: it sends four requests per user and
  micro-batch, hours at 1,000,000 users): ``df.groupBy("user_id").applyInPandas`` with
  ``with_state_grouped``: per user, one columnar ``add`` per state of the user's sum and count,
  then one ``get`` per state. What a function per group costs.
* **row-wise**: ``exactly_once`` + the pattern of ``pipelines/user_features.py``: Spark groups
  the events by user (``collect_list``), ``rdd.mapPartitions`` with ``with_state``, one
  ``ctx.writes`` batch (``add_all`` of the user's amounts, ``add`` of their count) and one
  ``ctx.reads`` batch per partition, the rows back through ``createDataFrame``. The same
  states.
* **no state** (``nostate``): the columnar job's Spark work without any state: the same
  ``repartition`` + ``mapInPandas`` and pandas grouping, the grouped sums written to the sink,
  plain ``foreachBatch``: the ceiling a state store under that job cannot pass.
* **Spark applyInPandasWithState**: ``groupBy("user_id").applyInPandasWithState`` in update
  mode, the (total, events) pair in Spark's own state store (the default HDFS-backed
  provider; Spark's checkpoint is its exactly-once), no Statehouse involved.

Two workloads by default, the same rows (4 micro-batches of 50,000 events) over 10,000 users
(about 5 events per user and micro-batch: Spark's grouping leaves the row-wise client a fifth
of the rows) and over 1,000,000 users (about one event per user and micro-batch: as many
operations as events on every path).

Per path and run: a fresh Spark checkpoint (and Statehouse job), the streaming query started
with ``availableNow`` and awaited; rows/s is the input rows over the query's wall time (query
start to termination: the micro-batches, their planning and Spark's and Statehouse's commits;
not the SparkSession's start: one warm-up run of each path on a smaller input precedes the
measured rounds). CPU µs per row: the Statehouse replicas' processes (their CPU clocks), and
Spark's: the driver JVM and every process under it (the Python daemon and workers; exited
ones count through their parent's ``cutime``) from ``/proc/<pid>/stat``, plus this Python
driver process (``foreachBatch`` and the coordinator run in it). Requests per micro-batch are
the replicas' own ``statehouse_http_requests_total`` (``/metrics``) before and after. After
each Statehouse run every user's total and count are read back and checked against pandas.

Each round runs every path once, the order reversed every other round; ratios are taken per
round, then their median.

    .venv/bin/python -m bench.spark_columnar --runs 3        # 10,000 and 1,000,000 users, ~15 min
    .venv/bin/python -m bench.spark_columnar --quick         # smoke run, under a minute
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import Summary, print_header, statehouse, table, write_json
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.spark import BatchContext, exactly_once, with_state, with_state_grouped, with_state_pandas
from statehouse.pipelines.user_features_columnar import PartitionEnd, with_partition_end

PATHS = ("columnar", "columnar-rows", "grouped", "rowwise", "nostate", "spark")
DEFAULT_PATHS = tuple(p for p in PATHS if p != "grouped")
STATEHOUSE_PATHS = ("columnar", "columnar-rows", "grouped", "rowwise")
LABELS = {
    "columnar": "columnar client, mapInPandas (grouped per Arrow batch)",
    "columnar-rows": "columnar client, mapInPandas (every row sent)",
    "grouped": "columnar client, applyInPandas (with_state_grouped: requests per user)",
    "rowwise": "row-wise client, collect_list + mapPartitions",
    "spark": "Spark applyInPandasWithState",
    "nostate": "no state: the columnar job's Spark work alone",
}
SCHEMA = "user_id STRING, amount DOUBLE"
OUTPUT_SCHEMA = "user_id STRING, total DOUBLE, events LONG"
STATES = {
    "total": {"kind": "reducing", "function": "sum", "value_type": "float64"},
    "events": {"kind": "reducing", "function": "sum", "value_type": "int64"},
}
_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


# -- input ---------------------------------------------------------------------------------


def write_input(directory: Path, batches: int, rows: int, users: int, seed: int) -> pd.DataFrame:
    """``batches`` Parquet files of ``rows`` events each (users uniform, amounts in cents); the
    events of all files as one DataFrame."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    frames = []
    for b in range(batches):
        ids = rng.integers(0, users, rows)
        frame = pd.DataFrame(
            {
                "user_id": pd.Series([f"user-{i}" for i in ids], dtype=object),
                "amount": rng.integers(100, 50_000, rows) / 100.0,
            }
        )
        table_ = pa.Table.from_pandas(frame, preserve_index=False).cast(
            pa.schema([("user_id", pa.string()), ("amount", pa.float64())])
        )
        pq.write_table(table_, directory / f"events-{b:04d}.parquet")
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


# -- the three jobs --------------------------------------------------------------------------


def columnar_step(every_row: bool) -> Callable[[Any, Any, BatchContext], Any]:
    def step(batch: Any, columns: Any, ctx: BatchContext) -> Any:
        if isinstance(batch, PartitionEnd):
            users = batch.users
            if not len(users):
                return None
            # to_numpy: PySpark cannot send a chunked Arrow-backed column (users concatenated from batches)
            return pd.DataFrame(
                {
                    "user_id": users.to_numpy(),
                    "total": columns.get("total", users).to_numpy(),
                    "events": columns.get("events", users).to_numpy(),
                }
            )
        if ctx.replay or not len(batch):
            return None
        if every_row:
            columns.add("total", batch["user_id"], batch["amount"])
            columns.add("events", batch["user_id"], 1)
        else:
            grouped = batch.groupby("user_id", sort=False)["amount"].agg(["sum", "size"])
            columns.add("total", grouped.index, grouped["sum"])
            columns.add("events", grouped.index, grouped["size"])
        return None

    return step


def columnar_process(every_row: bool) -> Callable[[Any, BatchContext], None]:
    def process(df: Any, ctx: BatchContext) -> None:
        update = with_partition_end(with_state_pandas(ctx, columnar_step(every_row)))
        df.repartition("user_id").mapInPandas(update, OUTPUT_SCHEMA).write.format("noop").mode("overwrite").save()

    return process


def grouped_step(group: pd.DataFrame, columns: Any, ctx: BatchContext) -> pd.DataFrame:
    user = group["user_id"].iloc[:1]
    if not ctx.replay:
        columns.add("total", user, float(group["amount"].sum()))
        columns.add("events", user, len(group))
    return pd.DataFrame(
        {
            "user_id": user.to_numpy(),
            "total": columns.get("total", user).to_numpy(),
            "events": columns.get("events", user).to_numpy(),
        }
    )


def grouped_process(df: Any, ctx: BatchContext) -> None:
    out = df.groupBy("user_id").applyInPandas(with_state_grouped(ctx, grouped_step), OUTPUT_SCHEMA)
    out.write.format("noop").mode("overwrite").save()


def rowwise_update(rows: Iterable[Any], job: Any, ctx: BatchContext) -> Iterator[tuple[str, float, int]]:
    users = [(row["user_id"], row["amounts"]) for row in rows]
    if not users:
        return
    if not ctx.replay:
        with ctx.writes(job) as writes:
            for user, amounts in users:
                writes.add_all("total", user, amounts)
                writes.add("events", user, len(amounts))
    with ctx.reads(job) as reads:
        pending = [(user, reads.get("total", user), reads.get("events", user)) for user, _amounts in users]
    for user, total, events in pending:
        yield (user, total.value, events.value)


def rowwise_process(df: Any, ctx: BatchContext) -> None:
    from pyspark.sql import functions as F

    grouped = df.groupBy("user_id").agg(F.collect_list("amount").alias("amounts"))
    out = grouped.rdd.mapPartitions(with_state(ctx, rowwise_update))
    df.sparkSession.createDataFrame(out, OUTPUT_SCHEMA).write.format("noop").mode("overwrite").save()


def spark_update(key: tuple[str], frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    total, events = state.get if state.exists else (0.0, 0)
    for frame in frames:
        total += float(frame["amount"].to_numpy().sum())
        events += len(frame)
    state.update((total, events))
    yield pd.DataFrame({"user_id": [key[0]], "total": [total], "events": [events]})


def nostate_map(batches: Iterable[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    for batch in batches:
        grouped = batch.groupby("user_id", sort=False)["amount"].agg(["sum", "size"])
        yield pd.DataFrame({"user_id": grouped.index.to_numpy(), "total": grouped["sum"], "events": grouped["size"]})


def nostate_process(df: Any, batch_id: int) -> None:
    df.repartition("user_id").mapInPandas(nostate_map, OUTPUT_SCHEMA).write.format("noop").mode("overwrite").save()


def start_query(spark: Any, path: str, input_dir: Path, checkpoint: Path, config: ClientConfig, job: str) -> Any:
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(input_dir))
    if path == "spark":
        writer = (
            events.groupBy("user_id")
            .applyInPandasWithState(spark_update, OUTPUT_SCHEMA, "total DOUBLE, events LONG", "update", "NoTimeout")
            .writeStream.format("noop")
            .outputMode("update")
        )
    elif path == "nostate":
        writer = events.writeStream.foreachBatch(nostate_process)
    else:
        if path == "rowwise":
            process = rowwise_process
        elif path == "grouped":
            process = grouped_process
        else:
            process = columnar_process(every_row=path == "columnar-rows")
        writer = events.writeStream.foreachBatch(exactly_once(config, job, process))
    return writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()


# -- measuring ---------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, command name, CPU ns of the process and its reaped children)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return int(fields[1]), name, ticks * _TICK_NS


def process_cpu_ns(pid: int) -> int:
    """CPU time of process ``pid`` (every thread), from its CPU clock (ns resolution)."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)  # CPUCLOCK_SCHED of the whole process
    except OSError:
        stat = _stat(pid)
        return stat[2] if stat else 0


def spark_cpu_ns(exclude: set[int]) -> dict[str, int]:
    """CPU of this process (the Python driver) and of every process under it except the
    Statehouse replicas (``exclude``): the JVM, Spark's Python daemon and workers."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                stats[int(entry)] = stat
    children: dict[int, list[int]] = {}
    for pid, (parent, _name, _ns) in stats.items():
        children.setdefault(parent, []).append(pid)
    me = os.getpid()
    out = {"driver": time.process_time_ns(), "jvm": 0, "python_workers": 0}
    stack = [p for p in children.get(me, []) if p not in exclude]
    while stack:
        pid = stack.pop()
        _parent, name, ns = stats[pid]
        out["jvm" if name == "java" else "python_workers" if name.startswith("python") else "jvm"] += ns
        stack.extend(p for p in children.get(pid, []) if p not in exclude)
    return out


def requests_served(url: str) -> int:
    """The replica's HTTP requests so far, except its /metrics scrapes."""
    text = httpx.get(url + "/metrics", timeout=10).text
    total = 0
    for line in text.splitlines():
        if line.startswith("statehouse_http_requests_total{") and 'route="/metrics"' not in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def check_state(config: ClientConfig, job: str, events: pd.DataFrame) -> None:
    expected = events.groupby("user_id")["amount"].agg(["sum", "size"])
    users = pd.Series(expected.index, dtype=object)
    with StatehouseClient(config) as client:
        columns = client.job(job).columns()
        totals = columns.get("total", users).to_numpy()
        counts = columns.get("events", users).to_numpy(dtype=np.int64)
    if not np.allclose(totals, expected["sum"].to_numpy()) or not np.array_equal(counts, expected["size"].to_numpy()):
        raise AssertionError(f"job {job}: the state differs from the input's sums and counts")


def measure(
    spark: Any,
    path: str,
    input_dir: Path,
    workdir: Path,
    config: ClientConfig,
    servers: list[Any],
    name: str,
    events: pd.DataFrame,
) -> dict[str, Any]:
    job = f"{path}-{name}"
    if path in STATEHOUSE_PATHS:
        with StatehouseClient(config) as client:
            handle = client.create_job(job, 128)
            for state, descriptor in STATES.items():
                handle.register(state, **descriptor)
    pids = {server.process.pid for server in servers}
    urls = [server.url for server in servers]
    requests_before = sum(requests_served(u) for u in urls)
    server_before = sum(process_cpu_ns(p) for p in pids)
    spark_before = spark_cpu_ns(pids)
    start = time.perf_counter()
    query = start_query(spark, path, input_dir, workdir / f"chk-{job}", config, job)
    query.awaitTermination()
    wall = time.perf_counter() - start
    spark_after = spark_cpu_ns(pids)
    server_after = sum(process_cpu_ns(p) for p in pids)
    requests = sum(requests_served(u) for u in urls) - requests_before
    if query.exception() is not None:
        raise RuntimeError(f"{path}: the query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    if rows != len(events):
        raise AssertionError(f"{path}: {rows} rows processed, {len(events)} expected")
    if path in STATEHOUSE_PATHS:
        check_state(config, job, events)
    spark_cpu = {k: (spark_after[k] - spark_before[k]) / 1e9 for k in spark_after}
    return {
        "rows": rows,
        "micro_batches": len(progress),
        "wall_s": wall,
        "rows_per_s": rows / wall,
        "server_cpu_s": (server_after - server_before) / 1e9,
        "spark_cpu_s": spark_cpu,
        "requests": requests,
    }


# -- running -------------------------------------------------------------------------------------


def local_spark(partitions: int) -> Any:
    """``local[2]`` with the JVM's default JIT and GC (the tests' session trades them for a
    faster start), ``partitions`` shuffle partitions, no UI."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("statehouse-bench-spark-columnar")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.default.parallelism", str(partitions))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=4, help="micro-batches (input files) per workload")
    parser.add_argument("--rows", type=int, default=50_000, help="rows per micro-batch")
    parser.add_argument("--users", default="10000,1000000", help="distinct users, one workload each (comma-separated)")
    parser.add_argument("--partitions", type=int, default=2, help="spark.sql.shuffle.partitions")
    parser.add_argument("--replicas", type=int, default=1, help="Statehouse replicas")
    parser.add_argument("--backend", default="rocksdb", choices=("rocksdb", "heap"))
    parser.add_argument("--paths", default=",".join(DEFAULT_PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 micro-batches of 2,000 rows, 1 run")
    parser.add_argument("--json", default=None)
    cfg = parser.parse_args(argv)
    cfg.paths = tuple(p.strip() for p in cfg.paths.split(",") if p.strip())
    if unknown := set(cfg.paths) - set(PATHS):
        parser.error(f"unknown paths: {', '.join(sorted(unknown))}")
    cfg.users = [int(u) for u in cfg.users.split(",") if u.strip()]
    if cfg.quick:
        cfg.runs, cfg.batches, cfg.rows, cfg.users = 1, 2, 2_000, [500]
    return cfg


@contextlib.contextmanager
def replicas(count: int, backend: str, workdir: Path) -> Iterator[list[Any]]:
    env = {"STATEHOUSE_REPLICA_COUNT": str(count), "STATEHOUSE_CHECKPOINT_DIR": str(workdir / "checkpoints")}
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                statehouse(backend, {**env, "STATEHOUSE_REPLICA_INDEX": str(i)}, workdir / f"replica-{i}")
            )
            for i in range(count)
        ]


def summarize(runs: list[dict[str, Any]]) -> dict[str, Summary]:
    rows = runs[0]["rows"]
    return {
        "rows_per_s": Summary([r["rows_per_s"] for r in runs]),
        "wall_s": Summary([r["wall_s"] for r in runs]),
        "server_us": Summary([r["server_cpu_s"] * 1e6 / rows for r in runs]),
        "spark_us": Summary([sum(r["spark_cpu_s"].values()) * 1e6 / rows for r in runs]),
        "jvm_us": Summary([r["spark_cpu_s"]["jvm"] * 1e6 / rows for r in runs]),
        "workers_us": Summary([r["spark_cpu_s"]["python_workers"] * 1e6 / rows for r in runs]),
        "driver_us": Summary([r["spark_cpu_s"]["driver"] * 1e6 / rows for r in runs]),
        "requests": Summary([r["requests"] / r["micro_batches"] for r in runs]),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header("Spark micro-batches with per-user sum/count state: columnar, row-wise, applyInPandasWithState")
    print(
        f"{cfg.batches} micro-batches of {cfg.rows:,} rows per workload, users {cfg.users}, "
        f"{cfg.partitions} shuffle partitions, {cfg.replicas} {cfg.backend} replica(s), local[2]"
    )
    load = os.getloadavg()[0]
    print(f"load average (1 min) at start: {load:.2f}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="statehouse-bench-spark-"))
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {u: {path: [] for path in cfg.paths} for u in cfg.users}
    try:
        warmup = write_input(workdir / "warmup", 1, max(1, cfg.rows // 5), cfg.users[0], seed=8)
        with replicas(cfg.replicas, cfg.backend, workdir) as servers:
            config = ClientConfig.of([s.url for s in servers])
            spark = local_spark(cfg.partitions)
            try:
                for path in cfg.paths:  # the JVM's JIT, Python workers, imports
                    measure(spark, path, workdir / "warmup", workdir, config, servers, "warmup", warmup)
                for users in cfg.users:
                    input_dir = workdir / f"input-{users}"
                    events = write_input(input_dir, cfg.batches, cfg.rows, users, seed=users)
                    for n in range(cfg.runs):
                        # Alternate which path goes first, so drift on the shared machine hits all alike.
                        for path in cfg.paths if n % 2 == 0 else cfg.paths[::-1]:
                            run = measure(spark, path, input_dir, workdir, config, servers, f"{users}-{n}", events)
                            runs[users][path].append(run)
                            print(
                                f"  {users:,} users, run {n}, {path}: {run['rows_per_s']:,.0f} rows/s, "
                                f"{run['wall_s']:.2f} s, server {run['server_cpu_s']:.2f} s CPU, Spark "
                                + ", ".join(f"{k} {v:.2f} s" for k, v in run["spark_cpu_s"].items())
                                + f", {run['requests'] / run['micro_batches']:.0f} requests/micro-batch",
                                flush=True,
                            )
            finally:
                spark.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    end_load = os.getloadavg()[0]
    print(f"load average (1 min) at end: {end_load:.2f}")
    headers = [
        "users (events/user/micro-batch)",
        "path",
        "rows/s",
        "query s",
        "requests/micro-batch",
        "server CPU µs/row",
        "Spark CPU µs/row",
        "JVM / Python workers / driver µs/row",
    ]
    lines: list[list[Any]] = []
    ratios: dict[str, dict[str, float]] = {}
    for users, by_path in runs.items():
        per_user = cfg.rows / users_per_batch(users, cfg.rows)
        workload = f"{users:,} ({per_user:.1f})"
        for path, path_runs in by_path.items():
            s = summarize(path_runs)
            lines.append(
                [
                    workload,
                    LABELS[path],
                    s["rows_per_s"].fmt(),
                    s["wall_s"].fmt(digits=2),
                    f"{s['requests'].median:,.0f}" if path in STATEHOUSE_PATHS else "-",
                    s["server_us"].fmt(digits=2) if path in STATEHOUSE_PATHS else "-",
                    s["spark_us"].fmt(digits=2),
                    f"{s['jvm_us'].median:.2f} / {s['workers_us'].median:.2f} / {s['driver_us'].median:.2f}",
                ]
            )
        for path in cfg.paths:
            for base in ("rowwise", "spark"):
                if path not in ("columnar", "columnar-rows", "grouped", "nostate") or base not in cfg.paths:
                    continue
                per_round = [
                    a["rows_per_s"] / b["rows_per_s"] for a, b in zip(by_path[path], by_path[base], strict=True)
                ]
                ratios[f"{users} users: {path}/{base}"] = {
                    "median": statistics.median(per_round),
                    "min": min(per_round),
                    "max": max(per_round),
                }
    print()
    print(table(headers, lines))
    print()
    for name, r in ratios.items():
        print(f"rows/s {name}: {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f}), per round")
    write_json(
        cfg.json,
        {
            "benchmark": "spark_columnar",
            "config": {k: v for k, v in vars(cfg).items() if k != "json"},
            "load": [load, end_load],
            "runs": runs,
            "ratios": ratios,
        },
    )
    return {"runs": runs, "ratios": ratios}


def users_per_batch(users: int, rows: int) -> float:
    """The expected distinct users among ``rows`` uniform draws from ``users``."""
    return users * -np.expm1(rows * np.log1p(-1 / users))


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
