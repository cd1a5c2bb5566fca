"""writeStream.format("statehouse"): each micro-batch applied exactly once, also when the driver is
SIGKILLed between Statehouse's commit of a batch (epoch committed, checkpoint taken) and Spark's (its
commit log), then restarted from its Spark checkpoint: Spark runs the batch again, the sink sees the
state holds it and applies nothing. The state is compared with a plain-Python oracle over all input.

The killed driver runs in a session of its own (this module, run as ``python -m tests.spark.test_spark_source_sink``)
so the kill takes its JVM and Python workers down at once, as tests/spark/test_spark_driver_kill.py does; the
query then restarts in the tests' own Spark session, from the same Spark checkpoint: all a restarted driver
resumes from is that checkpoint and the replicas (the dead JVM is gone either way).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from statehouse.client import StatehouseClient
from statehouse.client.coordinator import MicroBatchCoordinator
from statehouse.client.datasource import StatehouseDataSource, register
from tests.support.features_pipeline import write_input_file
from tests.support.server import REPO
from tests.support.spark_driver import Kill, die, kill_session

pytestmark = [pytest.mark.http, pytest.mark.spark, pytest.mark.slow]

KILL_BATCH = 1
RUN_TIMEOUT = 240.0


def events(files: int = 3, per_file: int = 120) -> list[list[dict]]:
    return [
        [{"user": f"u{(f * 7 + i) % 23}", "amount": float(i % 11 + f)} for i in range(per_file)] for f in range(files)
    ]


def run_driver(tmp_path: Path, urls: list[str], job: str, log: Path) -> int:
    """The driver killed at ``KILL_BATCH``, in a session of its own."""
    args = [sys.executable, "-m", "tests.spark.test_spark_source_sink", "--urls", ",".join(urls), "--job", job]
    args += ["--input", str(tmp_path / "input"), "--checkpoint", str(tmp_path / "spark-checkpoint")]
    args += ["--kill-batch", str(KILL_BATCH), "--kill-record", str(tmp_path / "killed")]
    with open(log, "wb") as out:
        driver = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return driver.wait(RUN_TIMEOUT)
    finally:
        kill_session(driver.pid)
        driver.wait(10)


def run_query(spark: Any, urls: str, job: str, input_dir: str, checkpoint: str, fmt: str = "statehouse") -> None:
    """The streaming query: the events in ``input_dir``, one file per micro-batch, into state 'spent', until it
    has caught up."""
    stream = spark.readStream.schema("user STRING, amount DOUBLE").option("maxFilesPerTrigger", 1).json(input_dir)
    query = (
        stream.selectExpr("user AS key", "amount AS value")
        .writeStream.format(fmt)
        .option("urls", urls)
        .option("job", job)
        .option("state", "spent")
        .option("op", "add")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def test_sink_killed_between_statehouse_and_spark_commits_is_exact(
    spark: Any, tmp_path: Path, replicas: list[str]
) -> None:
    job = "sink"
    batches = events()
    (tmp_path / "input").mkdir()
    for n, rows in enumerate(batches):
        write_input_file(tmp_path / "input", n, rows)
    with StatehouseClient(replicas) as client:
        client.create_job(job, 32).register("spent", "reducing", function="sum", value_type="float64")

    log = tmp_path / "killed.log"
    assert run_driver(tmp_path, replicas, job, log) == -9, log.read_text()[-5000:]
    assert (tmp_path / "killed").read_text().split() == ["after-statehouse-commit"]
    with StatehouseClient(replicas) as client:
        done = [c.metadata.get("batch_id") for c in MicroBatchCoordinator(client.job(job)).completed()]
    assert done[-1] == KILL_BATCH  # Statehouse holds the batch Spark has not committed

    register(spark)
    run_query(spark, ",".join(replicas), job, str(tmp_path / "input"), str(tmp_path / "spark-checkpoint"))
    oracle: dict[str, float] = defaultdict(float)
    for rows in batches:
        for row in rows:
            oracle[row["user"]] += row["amount"]
    with StatehouseClient(replicas) as client:
        j = client.job(job)
        got = dict(zip(oracle, j.columns().get("spent", list(oracle)).tolist(), strict=True))
        done = [c.metadata.get("batch_id") for c in MicroBatchCoordinator(j).completed()]
    assert got == pytest.approx(dict(oracle))  # zero over, zero under
    assert done == [-1, 0, 1, 2]  # one checkpoint per batch: the replayed batch 1 took none


def main() -> None:
    """The streaming driver killed once Statehouse committed ``--kill-batch``, before Spark did."""
    from statehouse.client.datasource.options import SourceOptions
    from statehouse.client.datasource.writer import StreamWriter
    from tests.support.spark import local_spark

    parser = argparse.ArgumentParser()
    for name in ("--urls", "--job", "--input", "--checkpoint", "--kill-record"):
        parser.add_argument(name)
    parser.add_argument("--kill-batch", type=int)
    args = parser.parse_args()
    spark = local_spark("sink-driver")
    register(spark)
    kill = Kill(os.getsid(0), args.kill_record)

    class KillingWriter(StreamWriter):
        def commit(self, messages, batchId):  # Spark's name
            super().commit(messages, batchId)
            if batchId == args.kill_batch:
                die(kill, "after-statehouse-commit")  # before Spark writes its commit log

    class KillingSource(StatehouseDataSource):
        @classmethod
        def name(cls) -> str:
            return "statehouse_killing"

        def streamWriter(self, schema, overwrite):
            return KillingWriter(SourceOptions.parse(self.options, writing=True), schema)

    spark.dataSource.register(KillingSource)
    run_query(spark, args.urls, args.job, args.input, args.checkpoint, fmt="statehouse_killing")
    spark.stop()


if __name__ == "__main__":
    main()
