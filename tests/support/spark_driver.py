"""The user-features streaming driver, able to SIGKILL itself at one step of the exactly-once protocol.

For the driver-failure tests (tests/spark/test_spark_driver_kill.py)::

    python -m tests.support.spark_driver --input D --output D --checkpoint D --statehouse URL1,URL2 --job NAME \\
        [--pipeline rows|columnar] [--kill-at STEP --kill-batch N --kill-record FILE]

``--pipeline``: the row-wise job (``docs/examples/user_features.py``, the default) or the columnar one
(``docs/examples/user_features_columnar.py``); both start through ``user_features.start``.

``python -m tests.support.spark_driver --args-from FILE``: a driver started ahead of its case, while the case
before runs: it starts its Spark session, runs a small warm-up job (no Statehouse, no input: what a first
micro-batch would start, pyspark's Python workers and the JVM's code paths), then waits for ``FILE``, a JSON
list of the arguments above, and runs as given them.

The failure is injected by wrapping things in this process only (the client's JSON calls, the function
handed to ``foreachBatch``, the pipeline's per-partition callback): the product code has no test hooks.
The kill takes the whole session down at once, as a lost driver machine would: the driver, its JVM,
and pyspark's daemon with its workers.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docs.examples import user_features, user_features_columnar
from statehouse.client import ClientConfig
from statehouse.client.spark import BatchContext
from statehouse.client.transport import ReplicaConnection
from tests.support.spark import local_spark

# In protocol order. mid-task: a task of the batch has staged its writes but not reported them.
STEPS = ("mid-task", "before-prepare", "before-commit", "mid-commit", "before-checkpoint", "after-checkpoint")
PIPELINES = {"rows": user_features, "columnar": user_features_columnar}
ARGS_LIMIT = 900.0  # seconds a driver started ahead waits for its arguments (a test run that died sends none)


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid``. pyspark's daemon moves itself and its workers into a
    process group of their own, so one ``killpg`` of the driver's group would leave them running."""
    groups = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):  # the process may be gone meanwhile
                if os.getsid(int(entry)) == sid:
                    groups.add(os.getpgid(int(entry)))
    own = os.getpgid(0)
    for group in groups - {own}:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    if own in groups:  # last: this ends the caller
        os.killpg(own, signal.SIGKILL)


@dataclass(frozen=True)
class Kill:
    """Whom to kill (picklable: a worker kills in mid-task) and where to say so."""

    session: int | None  # the driver's session, when the driver leads one (never the shell's)
    record: str | None  # a file: a worker's stderr goes through the JVM, which dies before printing it


def die(kill: Kill, step: str) -> None:
    """SIGKILL the driver's session, else the caller's process group."""
    print(f"spark_driver: SIGKILL at {step}", file=sys.stderr, flush=True)
    if kill.record is not None:
        with open(kill.record, "a") as record:
            record.write(step + "\n")
    if kill.session is not None:
        kill_session(kill.session)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def kill_in_task(kill_batch: int, kill: Kill, ctx: BatchContext) -> None:
    """The pipeline's ``on_partition`` (runs in a Python worker): die once a task of the batch has staged
    writes, before it reports them."""
    staged = ctx.attempt is not None and sum(ctx.attempt.message().ops) > 0
    if ctx.batch_id == kill_batch and staged:
        die(kill, "mid-task")


class Killer:
    """Kills the driver at ``step`` of micro-batch ``batch`` by wrapping the driver's client calls."""

    def __init__(self, step: str, batch: int, urls: tuple[str, ...], kill: Kill) -> None:
        self.step, self.batch, self.kill = step, batch, kill
        self.second = urls[1].rstrip("/")
        self.running: int | None = None  # the micro-batch foreachBatch is running
        self.first_committed = threading.Event()

    def install(self) -> None:
        original_json = ReplicaConnection.json
        original_exactly_once = user_features.exactly_once

        def json(conn: ReplicaConnection, method: str, path: str, body: Any = None, *, idempotent: bool = True) -> Any:
            if self.running == self.batch and method == "POST":
                self.before(conn, path)
            try:
                return original_json(conn, method, path, body, idempotent=idempotent)
            finally:  # on_each sends to both replicas in parallel: the second waits for the first's answer
                if self.running == self.batch and self.is_commit(path) and conn.url != self.second:
                    self.first_committed.set()

        def exactly_once(*args: Any, **kwargs: Any) -> Callable[[Any, int], None]:
            run = original_exactly_once(*args, **kwargs)

            def wrapped(df: Any, batch_id: int) -> None:
                self.running = batch_id
                run(df, batch_id)
                if self.step == "after-checkpoint" and batch_id == self.batch:
                    die(self.kill, self.step)  # the batch is checkpointed; Spark has not committed it

            return wrapped

        ReplicaConnection.json = json  # type: ignore[method-assign,assignment]
        user_features.exactly_once = exactly_once  # start() looks it up in the module

    @staticmethod
    def is_commit(path: str) -> bool:
        return "/epochs/" in path and path.endswith("/commit")

    def before(self, conn: ReplicaConnection, path: str) -> None:
        step = self.step
        if (
            (step == "before-prepare" and path.endswith("/prepare"))
            or (step == "before-commit" and self.is_commit(path))
            or (step == "before-checkpoint" and path.endswith("/checkpoints"))  # batch >= 1: no baseline here
        ):
            die(self.kill, step)
        if step == "mid-commit" and self.is_commit(path) and conn.url == self.second:
            self.first_committed.wait(60)
            die(self.kill, step)


def warm_up(spark: Any) -> None:
    """A small job shaped like a micro-batch's first stages (a group-by into Python tasks that import the
    pipelines): pyspark's daemon and workers started, the shuffle's code paths compiled."""
    from pyspark.sql import functions as F

    rows = [(f"user-{i % 7}", "pen", float(i)) for i in range(60)]
    events = spark.createDataFrame(rows, "user_id STRING, item STRING, amount DOUBLE")
    grouped = events.groupBy("user_id").agg(F.collect_list(F.struct("item", "amount")).alias("events"))
    grouped.rdd.mapPartitions(_import_pipelines).count()


def _import_pipelines(rows: Iterable[Any]) -> Iterator[int]:
    from docs.examples import user_features_columnar  # noqa: F401  (a columnar case's tasks import it)

    yield sum(1 for _ in rows)


def await_arguments(path: str) -> list[str]:
    """The arguments a driver started ahead is given: the JSON list in ``path``, once it is there."""
    deadline = time.monotonic() + ARGS_LIMIT
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"spark_driver: no arguments in {path} within {ARGS_LIMIT:.0f} s")
        time.sleep(0.02)
    return json.loads(Path(path).read_text())


def main(argv: list[str] | None = None) -> None:
    ahead = argparse.ArgumentParser(add_help=False)
    ahead.add_argument("--args-from", help="started ahead: warm up, then read the arguments from this file")
    early, _rest = ahead.parse_known_args(argv)
    spark = None
    if early.args_from is not None:
        began = time.monotonic()
        spark = local_spark("statehouse-driver-kill")
        warm_up(spark)
        ready = time.monotonic()
        print(f"spark_driver: session up and warmed in {ready - began:.1f} s", file=sys.stderr, flush=True)
        argv = await_arguments(early.args_from)
        print(f"spark_driver: given its arguments {time.monotonic() - ready:.1f} s later", file=sys.stderr, flush=True)

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint location")
    parser.add_argument("--statehouse", required=True, help="replica URLs, comma-separated, in index order")
    parser.add_argument("--job", required=True)
    parser.add_argument("--pipeline", choices=PIPELINES, default="rows")
    parser.add_argument("--kill-at", choices=STEPS)
    parser.add_argument("--kill-batch", type=int, default=1)
    parser.add_argument("--kill-record", help="a file the kill appends its step to")
    args = parser.parse_args(argv)
    if args.kill_at == "before-checkpoint" and args.kill_batch < 1:
        parser.error("before-checkpoint needs --kill-batch >= 1: batch 0's begin takes a baseline checkpoint too")

    kill = Kill(os.getpid() if os.getsid(0) == os.getpid() else None, args.kill_record)
    config = ClientConfig.of(args.statehouse)
    on_partition = None
    if args.kill_at == "mid-task":
        on_partition = functools.partial(kill_in_task, args.kill_batch, kill)
    elif args.kill_at is not None:
        Killer(args.kill_at, args.kill_batch, config.urls, kill).install()

    if spark is None:
        spark = local_spark("statehouse-driver-kill")
    run(spark, args.pipeline, config, args.job, args.input, args.output, args.checkpoint, on_partition)
    spark.stop()


def run(
    spark: Any,
    pipeline_name: str,
    config: ClientConfig,
    job: str,
    input_dir: str,
    output_dir: str,
    checkpoint_dir: str,
    on_partition: Callable[[BatchContext], None] | None = None,
) -> None:
    """The driver's query, one input file per micro-batch, until it has caught up. A restarted
    driver is this in any session: all it resumes from is the Spark checkpoint and the replicas."""
    pipeline = PIPELINES[pipeline_name]
    pipeline.setup(config, job)
    query = pipeline.start(
        spark,
        input_dir=input_dir,
        output_dir=output_dir,
        checkpoint_dir=checkpoint_dir,
        config=config,
        job=job,
        available_now=True,
        max_files_per_trigger=1,
        on_partition=on_partition,
    )
    query.awaitTermination()


if __name__ == "__main__":
    main()
