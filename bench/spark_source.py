"""format("statehouse") against Parquet: rows/s of a bootstrap write and a full-state read.

One value state of float64 (16-byte keys) on Statehouse replicas; the same rows as a DataFrame
(``spark.range`` → key, value). Per run:

* bootstrap: ``df.write.format("statehouse")...option("op", "put").save()`` — tasks stage their
  rows under their attempts, the driver commits one epoch on every replica and takes a checkpoint
  (all of it in the time) — beside ``df.write.parquet`` of the same rows;
* full read: ``spark.read.format("statehouse")...load()`` counted and summed (every row and column
  goes through Spark) beside ``spark.read.parquet`` of the same rows;
* the same keyed state read from checkpoint storage (local here), no replica involved:
  ``option("checkpoint", N)`` of the checkpoint the bootstrap's commit took (RocksDB's incremental:
  each task downloads its part and opens it read-only) and of a savepoint (the full format,
  range-read per key-group sub-range).

* the ceilings of any reader and writer written in Python: a Python data source that makes the
  same rows as Arrow columns and reads nothing, and one that takes the written rows and writes
  nothing (bench/arrow_source.py), through Spark's same paths;

* operator state, live and from a checkpoint: an operator's split list state (``--operator-elements``
  ints over 32 subtasks) read with ``option("operator", ...)`` from the replicas, and with
  ``option("checkpoint", N)`` from the checkpoint storage (local here) with no replica involved.

Each read is checked (count and sum) against the rows written. Spark's own ``statestore`` reader is
not measured: it reads a streaming query's state-store checkpoint, which this state never was.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Summary, print_header, table, write_json
from bench.spark_columnar import local_spark, replicas


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--backend", default="rocksdb", choices=("rocksdb", "heap"))
    parser.add_argument("--partitions", type=int, default=4, help="Spark partitions of the written DataFrame")
    parser.add_argument("--partitions-per-replica", type=int, default=2, help="input partitions per replica")
    parser.add_argument("--operator-elements", type=int, default=200_000, help="operator list elements")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10,000 keys, 1 run")
    parser.add_argument("--json", default=None)
    cfg = parser.parse_args(argv)
    if cfg.quick:
        cfg.keys, cfg.runs, cfg.operator_elements = 10_000, 1, 3_200
    return cfg


def timed(run: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None, spark: Any = None) -> dict[str, Any]:
    """``spark``: a running session to use (and leave running), as the tests pass theirs;
    otherwise one is started and stopped here."""
    cfg = parse(argv)
    print_header("format('statehouse'): bootstrap write and full-state read, beside Parquet")
    print(f"{cfg.keys:,} keys, {cfg.replicas} {cfg.backend} replicas, {cfg.runs} runs, Spark local[2]")
    from pyspark.sql import functions as F  # Spark's own convention

    from bench.arrow_source import ArrowRowsSource
    from statehouse.client import StatehouseClient
    from statehouse.client.datasource import register

    workdir = Path(tempfile.mkdtemp(prefix="statehouse-bench-source-"))
    results: dict[str, list[float]] = {
        "write": [],
        "read": [],
        "parquet_write": [],
        "parquet_read": [],
        "checkpoint_read": [],
        "savepoint_read": [],
        "operator_live": [],
        "operator_checkpoint": [],
        "python_ceiling": [],
        "python_write_ceiling": [],
    }
    expected_sum = float(cfg.keys * (cfg.keys - 1) // 2)
    try:
        with replicas(cfg.replicas, cfg.backend, workdir) as servers:
            urls = ",".join(s.url for s in servers)
            session = spark if spark is not None else local_spark(cfg.partitions)
            register(session)
            session.dataSource.register(ArrowRowsSource)
            rows = session.range(cfg.keys, numPartitions=cfg.partitions).selectExpr(
                "concat('k', lpad(cast(id AS STRING), 15, '0')) AS key", "cast(id AS DOUBLE) AS value"
            )
            for run in range(cfg.runs):
                job = f"bench-{run}"
                with StatehouseClient(urls) as client:
                    client.create_job(job, 128).register("value", "value", value_type="float64")
                options = {"urls": urls, "job": job, "state": "value"}
                write = rows.write.format("statehouse").mode("append").options(**options).option("op", "put")
                seconds, _ = timed(write.save)
                results["write"].append(cfg.keys / seconds)
                frame = session.read.format("statehouse").options(**options)
                frame = frame.option("partitions_per_replica", cfg.partitions_per_replica).load()
                seconds, found = timed(lambda f=frame: f.agg(F.count("key"), F.sum("value")).collect()[0])
                assert (found[0], found[1]) == (cfg.keys, expected_sum), found
                results["read"].append(cfg.keys / seconds)
                storage = str(workdir / "checkpoints")
                for name, snapshot in stored_snapshots(urls, job):
                    frame = session.read.format("statehouse").option("job", job).option("state", "value")
                    frame = frame.option("checkpoint", snapshot).option("checkpoint_storage", storage)
                    frame = frame.option("partitions_per_replica", cfg.partitions_per_replica).load()
                    seconds, found = timed(lambda f=frame: f.agg(F.count("key"), F.sum("value")).collect()[0])
                    assert (found[0], found[1]) == (cfg.keys, expected_sum), found
                    results[name].append(cfg.keys / seconds)

                discard = rows.write.format("arrow-rows").mode("append").option("rows", cfg.keys)
                seconds, _ = timed(discard.save)
                results["python_write_ceiling"].append(cfg.keys / seconds)
                frame = session.read.format("arrow-rows").option("rows", cfg.keys)
                frame = frame.option("partitions", cfg.replicas * cfg.partitions_per_replica).load()
                seconds, found = timed(lambda f=frame: f.agg(F.count("key"), F.sum("value")).collect()[0])
                assert (found[0], found[1]) == (cfg.keys, expected_sum), found
                results["python_ceiling"].append(cfg.keys / seconds)

                parquet = str(workdir / f"rows-{run}.parquet")
                seconds, _ = timed(lambda p=parquet: rows.write.parquet(p))
                results["parquet_write"].append(cfg.keys / seconds)
                table_ = session.read.parquet(parquet)
                seconds, found = timed(lambda t=table_: t.agg(F.count("key"), F.sum("value")).collect()[0])
                assert (found[0], found[1]) == (cfg.keys, expected_sum), found
                results["parquet_read"].append(cfg.keys / seconds)
                live, checkpoint = operator_state(session, urls, str(workdir / "checkpoints"), f"ops-{run}", cfg)
                results["operator_live"].append(live)
                results["operator_checkpoint"].append(checkpoint)
            if spark is None:
                session.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    summaries = {name: Summary(values) for name, values in results.items()}
    print()
    print(
        table(
            ["path", "rows/s", "vs Parquet"],
            [
                [
                    "bootstrap write (format statehouse, op put)",
                    summaries["write"].fmt(),
                    f"{summaries['write'].median / summaries['parquet_write'].median:.2f}x",
                ],
                ["df.write.parquet", summaries["parquet_write"].fmt(), "1x"],
                [
                    "a Python data source taking the same rows, writing nothing (arrow-rows)",
                    summaries["python_write_ceiling"].fmt(),
                    f"{summaries['python_write_ceiling'].median / summaries['parquet_write'].median:.2f}x",
                ],
                [
                    "full read (format statehouse)",
                    summaries["read"].fmt(),
                    f"{summaries['read'].median / summaries['parquet_read'].median:.2f}x",
                ],
                ["spark.read.parquet", summaries["parquet_read"].fmt(), "1x"],
                [
                    "full read from the checkpoint (option checkpoint)",
                    summaries["checkpoint_read"].fmt(),
                    f"{summaries['checkpoint_read'].median / summaries['parquet_read'].median:.2f}x",
                ],
                [
                    "full read from a savepoint (full format)",
                    summaries["savepoint_read"].fmt(),
                    f"{summaries['savepoint_read'].median / summaries['parquet_read'].median:.2f}x",
                ],
                [
                    "a Python data source making the same rows, reading nothing (arrow-rows)",
                    summaries["python_ceiling"].fmt(),
                    f"{summaries['python_ceiling'].median / summaries['parquet_read'].median:.2f}x",
                ],
                ["operator state, live (option operator)", summaries["operator_live"].fmt(), ""],
                [
                    "operator state, from a checkpoint (option checkpoint)",
                    summaries["operator_checkpoint"].fmt(),
                    f"{summaries['operator_checkpoint'].median / summaries['operator_live'].median:.2f}x live",
                ],
            ],
        )
    )
    data = {"config": vars(cfg), "results": {name: s.to_dict() for name, s in summaries.items()}}
    write_json(cfg.json, data)
    return data


SUBTASKS = 32


def stored_snapshots(urls: str, job: str) -> list[tuple[str, int]]:
    """The checkpoint the bootstrap's commit took, and a savepoint taken now (nothing written between)."""
    from statehouse.client import StatehouseClient
    from statehouse.client.coordinator import CheckpointCoordinator

    with StatehouseClient(urls) as client:
        coordinator = CheckpointCoordinator(client.job(job))
        latest = coordinator.latest()
        assert latest is not None
        return [("checkpoint_read", latest.checkpoint_id), ("savepoint_read", coordinator.savepoint().checkpoint_id)]


def operator_state(session: Any, urls: str, storage: str, job: str, cfg: argparse.Namespace) -> tuple[float, float]:
    """Rows/s of an operator's list state read live and from a checkpoint of it (each checked)."""
    from pyspark.sql import functions as F

    from statehouse.client import StatehouseClient
    from statehouse.client.coordinator import CheckpointCoordinator

    per = cfg.operator_elements // SUBTASKS
    total = per * SUBTASKS
    with StatehouseClient(urls) as client:
        j = client.create_job(job, 128)
        for subtask in range(SUBTASKS):
            j.update_operator_list("source", subtask, "offsets", list(range(subtask * per, (subtask + 1) * per)))
        checkpoint_id = CheckpointCoordinator(j).checkpoint().checkpoint_id
    live = session.read.format("statehouse").option("urls", urls).option("job", job).option("operator", "source")
    stored = session.read.format("statehouse").option("job", job).option("checkpoint", checkpoint_id)
    stored = stored.option("checkpoint_storage", storage).option("operator", "source")
    rates = []
    for reader in (live, stored):
        frame = reader.load()
        seconds, found = timed(
            lambda f=frame: f.agg(F.count("value"), F.sum(F.col("value").cast("bigint"))).collect()[0]
        )
        assert (found[0], found[1]) == (total, total * (total - 1) // 2), found
        rates.append(total / seconds)
    return rates[0], rates[1]


if __name__ == "__main__":
    main()
