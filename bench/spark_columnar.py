"""Benchmark 9: a Spark micro-batch job keeping per-user sum and count state, every way a user has.

The same input (Parquet files of ``user_id`` and ``amount``, one file per micro-batch), the
same machine, the same run. Each micro-batch updates every user's running ``total`` (sum of
amounts) and ``events`` (count) exactly once and writes the touched users' new values to
Spark's ``noop`` sink:

* **columnar**: ``exactly_once`` + ``df.repartition("user_id").mapInPandas`` with
  ``with_state_pandas`` (the pattern of ``docs/examples/user_features_columnar.py``): per Arrow
  batch the events are grouped by user with pandas (sum, size) and sent as one columnar
  ``add_get`` request over both states (``Columns.add_get_states``: one key column, a value
  column per state), which answers each user's new total and count; when the partition is
  done, each user's last answer is its row (a replayed micro-batch reads them with one
  ``get_states``). Two reducing ``sum`` states, ``value_type`` float64 and int64.
* **columnar, before add_get** (``columnar-separate``): the same job with
  one columnar ``add`` per state and Arrow batch, then one ``get`` per state when
  the partition is done.
* **columnar, every row** (``columnar-rows``): the ``columnar`` job without the pandas
  grouping: every event is a row of the ``add_get`` request (the server folds a user's rows in
  order), as the user-features job sends its sums.
* **grouped** (``--paths grouped``; not among the defaults: it sends four requests per user and
  micro-batch, hours at 1,000,000 users): ``df.groupBy("user_id").applyInPandas`` with
  ``with_state_grouped``: per user, one columnar ``add`` per state of the user's sum and count,
  then one ``get`` per state. What a function per group costs.
* **row-wise**: ``exactly_once`` + the pattern of ``docs/examples/user_features.py``: Spark groups
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
* **Spark transformWithStateInPandas** (``tws-pandas``) and **transformWithState** (``tws-row``,
  the Row API): Spark 4's state API v2, a ``StatefulProcessor`` with one value state of the
  (total, events) pair per user, update mode, on the RocksDB state store provider (the only one
  the API supports; set per query, the other paths keep the default). Needs ``protobuf``.
* **Redis** (``redis``; ``redis-aof``): what a user writes instead of a state store: the columnar
  job's ``repartition`` + ``mapInPandas`` and pandas grouping, then per Arrow batch one redis-py
  pipeline of ``INCRBYFLOAT`` (total) and ``INCRBY`` (count) per user, and after the partition's
  last batch one ``MGET`` per state (redis-py's default pipeline: MULTI/EXEC). ``redis-pipelined``:
  the strongest job a careful user writes, one ``pipeline(transaction=False)`` per Arrow batch
  whose ``INCRBYFLOAT``/``INCRBY`` replies are the new values (one round trip per batch). A
  redis-server started here on a free port, without persistence (``--save "" --appendonly no``),
  and a second one with ``--appendonly yes --appendfsync everysec``. At-least-once: a retried task
  or micro-batch adds again. Skipped with a message when ``redis-server`` is not on PATH.

Two workloads by default, the same rows (4 micro-batches of 50,000 events) over 10,000 users
(about 5 events per user and micro-batch: Spark's grouping leaves the row-wise client a fifth
of the rows) and over 1,000,000 users (about one event per user and micro-batch: as many
operations as events on every path).

Per path and run: a fresh Spark checkpoint (and Statehouse job), the streaming query started
with ``availableNow`` and awaited; rows/s is the input rows over the query's wall time (query
start to termination: the micro-batches, their planning and Spark's and Statehouse's commits;
not the SparkSession's start: one warm-up run of each path on a smaller input precedes the
measured rounds). CPU µs per row: the path's server (the Statehouse replicas' processes or the
redis-server, their CPU clocks), and Spark's: the driver JVM and every process under it (the
Python daemon and workers), each process's own utime + stime from ``/proc/<pid>/stat`` sampled
every 0.1 s, the last value kept for a process that exits (PySpark's daemon ignores SIGCHLD,
so an exited worker never reaches its parent's ``cutime``), plus this Python driver process
(``foreachBatch`` and the coordinator run in it). Requests per micro-batch are the replicas' own
``statehouse_http_requests_total`` (``/metrics``) before and after. After each run every user's
total and count are checked against pandas' over the input: read back from Statehouse, from
Redis (``MGET``), or from Spark's state store through its ``statestore`` reader (the state API
v2 paths and ``applyInPandasWithState``). ``nostate`` keeps none.

Each round runs every path once, the order reversed every other round; ratios are taken per
round, then their median. ``--prefill``: a state that has run for weeks; before each query every
user of the workload is stored (a zero total and count, through the columnar door or Redis's
``MSET``; not timed), so that events spread over, say, 10,000,000 users read stored keys; the
query starts once the servers are idle (RocksDB's flushes and compactions of the fill ended). Each run
also reports the server's resident memory and the replicas' data on disk.

    .venv/bin/python -m bench.spark_columnar --runs 3 --users 10000   # every path, ~15 min
    .venv/bin/python -m bench.spark_columnar --runs 3        # and 1,000,000 users (Spark state: minutes a run)
    .venv/bin/python -m bench.spark_columnar --quick         # smoke run, under a minute
    .venv/bin/python -m bench.spark_columnar --users 10000000 --prefill --paths columnar,redis-pipelined,nostate
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import (
    RedisServer,
    Summary,
    print_header,
    process_cpu_ns,
    redis_process,
    statehouse,
    table,
    write_json,
)
from bench.state import dir_bytes
from docs.examples.user_features_columnar import PartitionEnd, with_partition_end
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.global_checkpoints import CheckpointCoordinator
from statehouse.client.spark import BatchContext, exactly_once, with_state, with_state_grouped, with_state_pandas

PATHS = (
    "columnar",
    "columnar-separate",
    "columnar-rows",
    "grouped",
    "rowwise",
    "nostate",
    "spark",
    "redis",
    "redis-pipelined",
    "redis-aof",
    "tws-pandas",
    "tws-row",
)
DEFAULT_PATHS = tuple(p for p in PATHS if p != "grouped")
STATEHOUSE_PATHS = ("columnar", "columnar-separate", "columnar-rows", "grouped", "rowwise")
REDIS_PATHS = ("redis", "redis-pipelined", "redis-aof")
TWS_PATHS = ("tws-pandas", "tws-row")
LABELS = {
    "columnar": "columnar client, mapInPandas (grouped per Arrow batch)",
    "columnar-separate": "columnar client, mapInPandas (grouped; add, then get, per state: before add_get)",
    "columnar-rows": "columnar client, mapInPandas (every row sent)",
    "grouped": "columnar client, applyInPandas (with_state_grouped: requests per user)",
    "rowwise": "row-wise client, collect_list + mapPartitions",
    "spark": "Spark applyInPandasWithState",
    "nostate": "no state: the columnar job's Spark work alone",
    "redis": "Redis (no persistence), mapInPandas + redis-py pipeline",
    "redis-pipelined": "Redis (no persistence), mapInPandas + one non-transactional pipeline per batch",
    "redis-aof": "Redis (AOF, fsync every second), mapInPandas + redis-py pipeline",
    "tws-pandas": "Spark transformWithStateInPandas, RocksDB state store",
    "tws-row": "Spark transformWithState (Row API), RocksDB state store",
}
# Spark's state is partitioned by the shuffle partitions the checkpoint started with: more
# executors can run it, but its partitioning cannot change without a new checkpoint (state lost).
SPARK_STATE = "exactly-once, durable (Spark checkpoint), not rescalable (partitions fixed by the checkpoint)"
# What the user gets from each path's state, beside its speed (the rows of RESULTS §9's table).
GUARANTEES = {
    "columnar": "exactly-once, durable, rescalable",
    "columnar-separate": "exactly-once, durable, rescalable",
    "columnar-rows": "exactly-once, durable, rescalable",
    "grouped": "exactly-once, durable, rescalable",
    "rowwise": "exactly-once, durable, rescalable",
    "nostate": "no state",
    "spark": SPARK_STATE,
    "redis": "at-least-once (a retried task adds twice), lost on restart, not rescalable",
    "redis-pipelined": "at-least-once (a retried task adds twice), lost on restart, not rescalable",
    "redis-aof": "at-least-once, durable to the last second, not rescalable",
    "tws-pandas": SPARK_STATE,
    "tws-row": SPARK_STATE,
}
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
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


def columnar_step(every_row: bool, separate: bool = False) -> Callable[[Any, Any, BatchContext], Any]:
    """Per Arrow batch one ``add_get_states`` request updating both states and answering their
    new values; after the partition's last batch each user's last answer is its row (a replay,
    which must not write, reads them with one ``get_states``). ``separate``: the job before
    ``add_get`` and several-state requests, an ``add`` per state and batch and a ``get`` per state
    at the end (four requests where this is one)."""
    answered: list[pd.DataFrame] = []  # this partition's answers (the function is unpickled per task)

    def step(batch: Any, columns: Any, ctx: BatchContext) -> Any:
        if isinstance(batch, PartitionEnd):
            users = batch.users
            if not len(users):
                return None
            # to_numpy: PySpark cannot send a chunked Arrow-backed column (users concatenated from batches)
            if separate:
                values = {"total": columns.get("total", users), "events": columns.get("events", users)}
            elif answered:
                last = pd.concat(answered).drop_duplicates("user_id", keep="last").set_index("user_id")
                answered.clear()
                values = last.reindex(users.to_numpy())
            else:
                values = columns.get_states(["total", "events"], users)
            totals, counts = values["total"].to_numpy(), values["events"].to_numpy()
            return pd.DataFrame({"user_id": users.to_numpy(), "total": totals, "events": counts})
        if ctx.replay or not len(batch):
            return None
        if every_row:
            users, sums, counts = batch["user_id"], batch["amount"], 1
        else:
            grouped = batch.groupby("user_id", sort=False)["amount"].agg(["sum", "size"])
            users, sums, counts = grouped.index, grouped["sum"], grouped["size"]
        if separate:
            columns.add("total", users, sums)
            columns.add("events", users, counts)
        else:
            now = columns.add_get_states({"total": sums, "events": counts}, users, as_arrow=True)
            answered.append(pd.DataFrame({"user_id": np.asarray(users), **{k: v.to_numpy() for k, v in now.items()}}))
        return None

    return step


def columnar_process(every_row: bool, separate: bool = False) -> Callable[[Any, BatchContext], None]:
    def process(df: Any, ctx: BatchContext) -> None:
        update = with_partition_end(with_state_pandas(ctx, columnar_step(every_row, separate)))
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


def redis_keys(prefix: str, users: Any) -> tuple[list[str], list[str]]:
    return [f"{prefix}:t:{u}" for u in users], [f"{prefix}:e:{u}" for u in users]


def queue_increments(pipe: Any, prefix: str, batch: pd.DataFrame) -> pd.DataFrame:
    """Queue on ``pipe`` one INCRBYFLOAT (total) and one INCRBY (count) per user of ``batch``, its
    events grouped in pandas; the grouped sums and sizes, in the order queued."""
    grouped = batch.groupby("user_id", sort=False)["amount"].agg(["sum", "size"])
    totals, counts = redis_keys(prefix, grouped.index)
    for total_key, count_key, total, count in zip(
        totals, counts, grouped["sum"].tolist(), grouped["size"].tolist(), strict=True
    ):
        pipe.incrbyfloat(total_key, total)
        pipe.incrby(count_key, count)
    return grouped


def redis_map(port: int, prefix: str) -> Callable[[Iterable[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """What a user writes without Statehouse: per Arrow batch the events grouped by user in
    pandas, one redis-py pipeline of INCRBYFLOAT (total) and INCRBY (count) per user; after the
    partition's last batch one MGET per state of its users. A retried task adds twice."""

    def update(batches: Iterable[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import redis

        client = redis.Redis(host="127.0.0.1", port=port)
        try:
            seen = []
            for batch in batches:
                if not len(batch):
                    continue
                pipe = client.pipeline()
                grouped = queue_increments(pipe, prefix, batch)
                pipe.execute()
                seen.append(grouped.index.to_numpy())
            if seen:
                users = pd.unique(np.concatenate(seen))
                totals, counts = redis_keys(prefix, users)
                yield pd.DataFrame(
                    {
                        "user_id": users,
                        "total": np.array(client.mget(totals), dtype=np.float64),
                        "events": np.array(client.mget(counts), dtype=np.int64),
                    }
                )
        finally:
            client.close()

    return update


def redis_pipelined_map(port: int, prefix: str) -> Callable[[Iterable[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """The strongest Redis job a careful user writes: per Arrow batch the events grouped by user
    in pandas, then one ``pipeline(transaction=False)`` (no MULTI/EXEC) of INCRBYFLOAT and INCRBY
    per user, whose replies are the new values: one round trip per batch. A retried task adds
    twice."""

    def update(batches: Iterable[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import redis

        client = redis.Redis(host="127.0.0.1", port=port)
        try:
            for batch in batches:
                if not len(batch):
                    continue
                pipe = client.pipeline(transaction=False)
                grouped = queue_increments(pipe, prefix, batch)
                replies = pipe.execute()
                yield pd.DataFrame(
                    {
                        "user_id": grouped.index.to_numpy(),
                        "total": np.array(replies[0::2], dtype=np.float64),
                        "events": np.array(replies[1::2], dtype=np.int64),
                    }
                )
        finally:
            client.close()

    return update


def redis_process_batch(port: int, prefix: str, path: str) -> Callable[[Any, int], None]:
    make_map = redis_pipelined_map if path == "redis-pipelined" else redis_map

    def process(df: Any, batch_id: int) -> None:
        out = df.repartition("user_id").mapInPandas(make_map(port, prefix), OUTPUT_SCHEMA)
        out.write.format("noop").mode("overwrite").save()

    return process


def _sum_count_state(handle: Any) -> Any:
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    schema = StructType([StructField("total", DoubleType()), StructField("events", LongType())])
    return handle.getValueState("sums", schema)


def tws_processors() -> tuple[Any, Any]:
    """Spark 4's state API v2 processors (imported lazily: pyspark is only needed here), the
    (total, events) pair as one value state per user."""
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor

    class SumCountPandas(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.state = _sum_count_state(handle)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:
            total, events = self.state.get() if self.state.exists() else (0.0, 0)
            for frame in rows:
                total += float(frame["amount"].to_numpy().sum())
                events += len(frame)
            self.state.update((total, events))
            yield pd.DataFrame({"user_id": [key[0]], "total": [total], "events": [events]})

        def close(self) -> None:
            pass

    class SumCountRows(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.state = _sum_count_state(handle)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            total, events = self.state.get() if self.state.exists() else (0.0, 0)
            for row in rows:
                total += row.amount
                events += 1
            self.state.update((total, events))
            yield Row(user_id=key[0], total=total, events=events)

        def close(self) -> None:
            pass

    return SumCountPandas, SumCountRows


def start_query(
    spark: Any, path: str, input_dir: Path, checkpoint: Path, config: ClientConfig, job: str, redis_port: int = 0
) -> Any:
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(input_dir))
    # The state API v2 runs on RocksDB only; applyInPandasWithState keeps Spark's default store.
    if path in TWS_PATHS:
        spark.conf.set(PROVIDER_CONF, ROCKSDB_PROVIDER)
    else:
        spark.conf.unset(PROVIDER_CONF)
    if path in TWS_PATHS:
        pandas_processor, row_processor = tws_processors()
        grouped_events = events.groupBy("user_id")
        transform = (
            grouped_events.transformWithStateInPandas(pandas_processor(), OUTPUT_SCHEMA, "Update", "None")
            if path == "tws-pandas"
            else grouped_events.transformWithState(row_processor(), OUTPUT_SCHEMA, "Update", "None")
        )
        writer = transform.writeStream.format("noop").outputMode("update")
    elif path in REDIS_PATHS:
        writer = events.writeStream.foreachBatch(redis_process_batch(redis_port, job, path))
    elif path == "spark":
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
            process = columnar_process(every_row=path == "columnar-rows", separate=path == "columnar-separate")
        writer = events.writeStream.foreachBatch(exactly_once(config, job, process))
    return writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()


# -- measuring ---------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, str, int, int] | None:
    """(parent pid, command name, start time in ticks, CPU ns of the process itself: utime +
    stime, not its reaped children's)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[1]), name, int(fields[19]), (int(fields[11]) + int(fields[12])) * _TICK_NS


class SparkCpu:
    """CPU of this process (the Python driver) and of every process under it except the servers
    (``exclude``): the JVM, Spark's Python daemon and workers.

    Each process's own clock is sampled every ``interval`` seconds in a thread, and the last value
    seen of a process that exited is kept: PySpark's daemon ignores SIGCHLD, so an exited worker is
    never reaped into its parent's ``cutime`` and a before/after walk of the tree loses its CPU
    (one run printed ``python_workers -49.23 s``). What a process spends after its last sample
    (at most ``interval``), or a process that lives less than ``interval``, is not counted."""

    def __init__(self, exclude: set[int], interval: float = 0.1) -> None:
        self.exclude = exclude
        self.interval = interval
        self.seen: dict[tuple[int, int], tuple[str, int]] = {}  # (pid, start time) -> (kind, ns)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.sampler_ns = 0
        self.thread = threading.Thread(target=self._run, name="spark-cpu-sampler", daemon=True)

    def _sample(self) -> None:
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (stat := _stat(int(entry))) is not None:
                stats[int(entry)] = stat
        children: dict[int, list[int]] = {}
        for pid, stat in stats.items():
            children.setdefault(stat[0], []).append(pid)
        stack = [p for p in children.get(os.getpid(), []) if p not in self.exclude]
        with self.lock:
            while stack:
                pid = stack.pop()
                _parent, name, started, ns = stats[pid]
                kind = "python_workers" if name.startswith("python") else "jvm"  # java, and its launcher
                self.seen[(pid, started)] = (kind, ns)
                stack.extend(p for p in children.get(pid, []) if p not in self.exclude)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            self._sample()
        self.sampler_ns = time.thread_time_ns()

    def snapshot(self) -> tuple[int, dict[tuple[int, int], tuple[str, int]]]:
        self._sample()
        with self.lock:
            return time.process_time_ns(), dict(self.seen)

    def __enter__(self) -> SparkCpu:
        self.before = self.snapshot()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()
        self.after = self.snapshot()

    def seconds(self) -> dict[str, float]:
        """CPU seconds between enter and exit: the driver (less this sampler's thread), the JVM,
        the Python workers."""
        (driver_before, before), (driver_after, after) = self.before, self.after
        out = {"driver": (driver_after - driver_before - self.sampler_ns) / 1e9, "jvm": 0.0, "python_workers": 0.0}
        for key, (kind, ns) in after.items():
            out[kind] += (ns - before.get(key, (kind, 0))[1]) / 1e9
        return out


def requests_served(url: str) -> int:
    """The replica's HTTP requests so far, except its /metrics scrapes."""
    text = httpx.get(url + "/metrics", timeout=10).text
    total = 0
    for line in text.splitlines():
        if line.startswith("statehouse_http_requests_total{") and 'route="/metrics"' not in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def expected_state(events: pd.DataFrame) -> pd.DataFrame:
    """The oracle every path is checked against: each user's sum and count over the input."""
    return events.groupby("user_id")["amount"].agg(["sum", "size"])


def check_values(path: str, expected: pd.DataFrame, totals: Any, counts: Any) -> None:
    totals = np.asarray(totals, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    if not np.allclose(totals, expected["sum"].to_numpy()) or not np.array_equal(counts, expected["size"].to_numpy()):
        raise AssertionError(f"{path}: the state differs from the input's sums and counts")


PREFILL_CHUNK = 250_000  # users stored per request (per state) by --prefill
SETTLE_IDLE = 0.05  # a server that used less than this share of a core over SETTLE_WINDOW s is idle
SETTLE_WINDOW = 2.0
SETTLE_MOST = 600.0  # seconds the settle waits at most


def settle(pids: set[int]) -> float:
    """Wait until the servers ``pids`` are idle (RocksDB's flushes and compactions of the prefill
    ended), so that the query's time and CPU are its own; seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < SETTLE_MOST:
        before = sum(process_cpu_ns(p) for p in pids)
        time.sleep(SETTLE_WINDOW)
        if sum(process_cpu_ns(p) for p in pids) - before < SETTLE_IDLE * SETTLE_WINDOW * 1e9:
            break
    return time.perf_counter() - started


def prefill(path: str, job: str, users: int, config: ClientConfig, redis: dict[str, RedisServer]) -> float:
    """Store every user of the workload before the query (a total and a count of zero), as a state
    that has run for weeks holds them: through the columnar door (then checkpointed), or Redis's
    MSET; seconds taken. Adding zero changes no sum, so the checks stand. Other paths keep no
    state of their own."""
    started = time.perf_counter()
    chunks = (range(s, min(users, s + PREFILL_CHUNK)) for s in range(0, users, PREFILL_CHUNK))
    if path in STATEHOUSE_PATHS:
        with StatehouseClient(config) as client:
            handle = client.job(job)
            columns = handle.columns()
            for chunk in chunks:
                ids = pd.Series([f"user-{i}" for i in chunk], dtype=object)
                columns.add_states({"total": np.zeros(len(ids)), "events": np.zeros(len(ids), np.int64)}, ids)
            # Checkpointed, as a long-running state is: the query's checkpoints upload what it changes.
            CheckpointCoordinator(handle, timeout=1800).checkpoint()
    elif path in REDIS_PATHS:
        import redis as redis_py

        with redis_py.Redis(host="127.0.0.1", port=redis[path].port) as client:
            for chunk in chunks:
                totals, counts = redis_keys(job, (f"user-{i}" for i in chunk))
                client.mset(dict.fromkeys(totals + counts, 0))
    return time.perf_counter() - started


def server_footprint(pids: set[int], servers: list[Any], path: str) -> dict[str, float]:
    """The path's server processes' resident memory, and the Statehouse replicas' data on disk."""
    rss = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as status:
            rss += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) * 1024
    disk = 0
    if path in STATEHOUSE_PATHS:
        for server in servers:
            disk += dir_bytes(Path(server.settings["STATEHOUSE_DATA_DIR"]))
    return {"server_rss_mb": rss / 1e6, "server_disk_mb": disk / 1e6}


def check_state(config: ClientConfig, job: str, events: pd.DataFrame) -> None:
    expected = expected_state(events)
    users = pd.Series(expected.index, dtype=object)
    with StatehouseClient(config) as client:
        columns = client.job(job).columns()
        check_values(job, expected, columns.get("total", users).to_numpy(), columns.get("events", users).to_numpy())


def check_redis(port: int, job: str, events: pd.DataFrame) -> None:
    import redis

    expected = expected_state(events)
    totals, counts = redis_keys(job, expected.index)
    with redis.Redis(host="127.0.0.1", port=port) as client:
        check_values(job, expected, client.mget(totals), client.mget(counts))
        client.flushall()  # the next run's keys are its own; this run's only take memory


def check_spark_state(spark: Any, path: str, job: str, checkpoint: Path, events: pd.DataFrame) -> None:
    """Spark's own state after the query, through its state data source reader (the state API v2
    names its value state; applyInPandasWithState's pair sits in ``value.groupState``)."""
    reader = spark.read.format("statestore")
    if path in TWS_PATHS:
        state, value = reader.option("stateVarName", "sums").load(str(checkpoint)), "value"
    else:
        state, value = reader.load(str(checkpoint)), "value.groupState"
    columns = ["key.user_id AS user_id", f"{value}.total AS total", f"{value}.events AS events"]
    found = state.selectExpr(*columns).toPandas()
    found = found.set_index("user_id").sort_index()
    expected = expected_state(events).sort_index()
    if not found.index.equals(expected.index):
        raise AssertionError(f"{job}: Spark's state holds {len(found)} users, {len(expected)} expected")
    check_values(job, expected, found["total"], found["events"])


def measure(
    spark: Any,
    path: str,
    input_dir: Path,
    workdir: Path,
    config: ClientConfig,
    servers: list[Any],
    redis: dict[str, RedisServer],
    name: str,
    events: pd.DataFrame,
    prefill_users: int = 0,
) -> dict[str, Any]:
    job = f"{path}-{name}"
    if path in STATEHOUSE_PATHS:
        with StatehouseClient(config) as client:
            handle = client.create_job(job, 128)
            for state, descriptor in STATES.items():
                handle.register(state, **descriptor)
    prefill_s = prefill(path, job, prefill_users, config, redis) if prefill_users else 0.0
    statehouse_pids = {server.process.pid for server in servers}
    redis_pids = {server.process.pid for server in redis.values()}
    # The path's own server: its CPU is the "server" column; every server is kept out of Spark's.
    pids = statehouse_pids if path in STATEHOUSE_PATHS else {redis[path].process.pid} if path in REDIS_PATHS else set()
    settled_s = settle(pids) if prefill_users else 0.0
    urls = [server.url for server in servers]
    checkpoint = workdir / f"chk-{job}"
    requests_before = sum(requests_served(u) for u in urls)
    server_before = sum(process_cpu_ns(p) for p in pids)
    with SparkCpu(statehouse_pids | redis_pids) as spark_cpu:
        start = time.perf_counter()
        port = redis[path].port if path in REDIS_PATHS else 0
        query = start_query(spark, path, input_dir, checkpoint, config, job, port)
        query.awaitTermination()
        wall = time.perf_counter() - start
    server_after = sum(process_cpu_ns(p) for p in pids)
    requests = sum(requests_served(u) for u in urls) - requests_before
    if query.exception() is not None:
        raise RuntimeError(f"{path}: the query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    if rows != len(events):
        raise AssertionError(f"{path}: {rows} rows processed, {len(events)} expected")
    footprint = server_footprint(pids, servers, path)
    if path in STATEHOUSE_PATHS:
        check_state(config, job, events)
    elif path in REDIS_PATHS:
        check_redis(redis[path].port, job, events)
    elif path in (*TWS_PATHS, "spark"):
        check_spark_state(spark, path, job, checkpoint, events)
    return {
        "rows": rows,
        "micro_batches": len(progress),
        "wall_s": wall,
        "rows_per_s": rows / wall,
        "server_cpu_s": (server_after - server_before) / 1e9,
        "spark_cpu_s": spark_cpu.seconds(),
        "requests": requests,
        "prefill_s": prefill_s,
        "settled_s": settled_s,
        **footprint,
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
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 micro-batches of 500 rows, 100 users, 1 run, no warm-up"
    )
    parser.add_argument(
        "--prefill",
        action="store_true",
        help="store every user of a workload before each query (Statehouse and Redis paths; not timed)",
    )
    parser.add_argument("--json", default=None)
    cfg = parser.parse_args(argv)
    cfg.paths = tuple(p.strip() for p in cfg.paths.split(",") if p.strip())
    if unknown := set(cfg.paths) - set(PATHS):
        parser.error(f"unknown paths: {', '.join(sorted(unknown))}")
    cfg.users = [int(u) for u in cfg.users.split(",") if u.strip()]
    if cfg.quick:
        cfg.runs, cfg.batches, cfg.rows, cfg.users = 1, 2, 500, [100]
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


def main(argv: list[str] | None = None, spark: Any = None) -> dict[str, Any]:
    """``spark``: a running session to use (and leave running), as the tests pass theirs;
    otherwise one is started and stopped here."""
    cfg = parse(argv)
    if shutil.which("redis-server") is None and (skipped := [p for p in cfg.paths if p in REDIS_PATHS]):
        print(f"redis-server is not on PATH: skipping {', '.join(skipped)} (apt-get install redis-server)")
        cfg.paths = tuple(p for p in cfg.paths if p not in REDIS_PATHS)
    print_header("Spark micro-batches with per-user sum/count state: Statehouse, Redis, Spark's own state stores")
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
        with replicas(cfg.replicas, cfg.backend, workdir) as servers, contextlib.ExitStack() as stack:
            redis: dict[str, RedisServer] = {}
            for path in REDIS_PATHS:
                if path in cfg.paths and (server := stack.enter_context(redis_process(path == "redis-aof"))):
                    redis[path] = server
            config = ClientConfig.of([s.url for s in servers])
            owned = spark is None
            spark = local_spark(cfg.partitions) if owned else spark
            partitions = spark.conf.get("spark.sql.shuffle.partitions")
            spark.conf.set("spark.sql.shuffle.partitions", str(cfg.partitions))  # a given session's too
            try:
                for path in cfg.paths if not cfg.quick else ():  # the JVM's JIT, Python workers, imports
                    measure(spark, path, workdir / "warmup", workdir, config, servers, redis, "warmup", warmup)
                for users in cfg.users:
                    input_dir = workdir / f"input-{users}"
                    events = write_input(input_dir, cfg.batches, cfg.rows, users, seed=users)
                    for n in range(cfg.runs):
                        # Alternate which path goes first, so drift on the shared machine hits all alike.
                        for path in cfg.paths if n % 2 == 0 else cfg.paths[::-1]:
                            name = f"{users}-{n}"
                            filled = users if cfg.prefill else 0
                            run = measure(spark, path, input_dir, workdir, config, servers, redis, name, events, filled)
                            runs[users][path].append(run)
                            print(
                                f"  {users:,} users, run {n}, {path}: {run['rows_per_s']:,.0f} rows/s, "
                                f"{run['wall_s']:.2f} s, server {run['server_cpu_s']:.2f} s CPU, Spark "
                                + ", ".join(f"{k} {v:.2f} s" for k, v in run["spark_cpu_s"].items())
                                + f", {run['requests'] / run['micro_batches']:.0f} requests/micro-batch"
                                + f", server RSS {run['server_rss_mb']:,.0f} MB, disk {run['server_disk_mb']:,.0f} MB"
                                + (f", prefilled in {run['prefill_s']:.0f} s" if cfg.prefill else "")
                                + (f", settled in {run['settled_s']:.0f} s" if cfg.prefill else ""),
                                flush=True,
                            )
            finally:
                spark.conf.unset(PROVIDER_CONF)
                spark.conf.set("spark.sql.shuffle.partitions", partitions)
                if owned:
                    spark.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    end_load = os.getloadavg()[0]
    print(f"load average (1 min) at end: {end_load:.2f}")
    headers = [
        "users (events/user/micro-batch)",
        "path",
        "guarantees",
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
                    GUARANTEES[path],
                    s["rows_per_s"].fmt(),
                    s["wall_s"].fmt(digits=2),
                    f"{s['requests'].median:,.0f}" if path in STATEHOUSE_PATHS else "-",
                    s["server_us"].fmt(digits=2) if path in STATEHOUSE_PATHS + REDIS_PATHS else "-",
                    s["spark_us"].fmt(digits=2),
                    f"{s['jvm_us'].median:.2f} / {s['workers_us'].median:.2f} / {s['driver_us'].median:.2f}",
                ]
            )
        for path in cfg.paths:
            for base in ("columnar-separate", "rowwise", "spark", *REDIS_PATHS, *TWS_PATHS, "nostate"):
                if path not in ("columnar", "columnar-separate", "columnar-rows", "grouped", "nostate"):
                    continue
                if base not in cfg.paths:
                    continue
                if path == base:
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
