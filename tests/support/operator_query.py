"""The user-features exactly-once query as a long-running service, paced by its input, for the operator-rescale
test (tests/spark/test_spark_operator_rescale.py)::

    python -m tests.support.operator_query --input D --output D --checkpoint D --statehouse URL1,URL2 --job NAME \\
        --markers DIR --batches N [--fail-task BATCH]... [--hold-commit BATCH]... [--hold-checkpoint BATCH]... \\
        [--kill-in-task BATCH] [--restart]

The query (``user_features.start`` with a continuous trigger, one input file per micro-batch) takes each file as
it appears in ``--input`` and stops, exit 0, once micro-batch ``N - 1`` is done; a failed query exits non-zero.
It never rescales: the replica set changes under it, from outside. ``--restart``: a driver restarted after a
crash, which calls ``MicroBatchCoordinator.recover()`` first, as docs/spark.md says.

What the test watches and steers, as files in ``--markers``: ``begun-B`` when ``foreachBatch`` starts micro-batch
``B`` and ``done-B`` once it returned (committed and checkpointed). Faults (``--fail-task`` acts once across
restarts): ``--fail-task B`` fails the first attempt of a task of batch ``B`` after its writes (Spark retries it);
``--hold-commit B`` holds the commit of batch ``B`` (its first epoch prepare) once its tasks are done: touches
``at-commit-B`` and waits for ``go-commit-B``, so the test can start a move while the batch is in flight;
``--hold-checkpoint B`` likewise holds batch ``B``'s checkpoint once its epoch commit was sent (``at-checkpoint-B``,
``go-checkpoint-B``), so that a move can run between a batch's commit and its checkpoint;
``--kill-in-task B`` SIGKILLs the driver's session once a task of batch ``B`` has staged its writes. As in
tests/support/spark_driver.py, faults wrap things in this process only: the product code has no test hooks.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from docs.examples import user_features
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.coordinator import MicroBatchCoordinator
from statehouse.client.spark import BatchContext
from statehouse.client.transport import ReplicaConnection
from tests.support.rescale_driver import fail_task
from tests.support.spark import local_spark
from tests.support.spark_driver import Kill, kill_in_task

HOLD_LIMIT = 120.0  # seconds a held commit waits for the test's go (a test that died leaves no go)
PREPARE = re.compile(r"/v1/jobs/[^/]+/epochs/\d+/prepare$")
COMMIT = re.compile(r"/v1/jobs/[^/]+/epochs/\d+/commit$")
TRIGGER = re.compile(r"/v1/jobs/[^/]+/checkpoints$")  # a global checkpoint's trigger


class Markers:
    """The marker directory: what the driver reports, and the holds the test releases."""

    def __init__(self, directory: str, hold_commit: frozenset[int], hold_checkpoint: frozenset[int]) -> None:
        self.directory = Path(directory)
        self.hold_commit, self.hold_checkpoint = hold_commit, hold_checkpoint
        self.running: int | None = None  # the micro-batch foreachBatch is running
        self.committed: int | None = None  # the micro-batch whose epoch commit was sent

    def touch(self, name: str) -> None:
        (self.directory / name).touch()

    def install(self) -> None:
        """Wrap the driver's JSON calls: a held batch's epoch prepare, or its checkpoint's trigger after its
        commit, waits for the test's go."""
        original = ReplicaConnection.json

        def json(conn: ReplicaConnection, method: str, path: str, body: Any = None, *, idempotent: bool = True) -> Any:
            batch = self.running
            if method == "POST" and batch in self.hold_commit and PREPARE.search(path):
                self.hold("commit", batch)
            if method == "POST" and COMMIT.search(path):
                self.committed = batch
            elif (
                method == "POST" and TRIGGER.search(path) and batch in self.hold_checkpoint and self.committed == batch
            ):
                self.hold("checkpoint", batch)
            return original(conn, method, path, body, idempotent=idempotent)

        ReplicaConnection.json = json  # type: ignore[method-assign,assignment]

    def hold(self, step: str, batch: int) -> None:
        """Every replica's request of ``step`` of ``batch`` waits here (they are sent in parallel) until
        ``go-STEP-B``."""
        self.touch(f"at-{step}-{batch}")
        go = self.directory / f"go-{step}-{batch}"
        deadline = time.monotonic() + HOLD_LIMIT
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def wrap(self, run: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        """The ``foreachBatch`` function, reporting each micro-batch's start and end."""

        def wrapped(df: Any, batch_id: int) -> None:
            self.running = batch_id
            self.touch(f"begun-{batch_id}")
            run(df, batch_id)
            self.touch(f"done-{batch_id}")

        return wrapped


def on_partition(fail: frozenset[int], kill_batch: int | None, kill: Kill, markers: str, ctx: BatchContext) -> None:
    """The pipeline's ``on_partition`` (runs in a Python worker, after the task's writes and reads)."""
    if kill_batch is not None:
        kill_in_task(kill_batch, kill, ctx)
    fail_task(fail, markers, ctx)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint location")
    parser.add_argument("--statehouse", required=True, help="replica URLs (seeds), comma-separated")
    parser.add_argument("--job", required=True)
    parser.add_argument("--markers", required=True, help="a directory for the markers and once-only faults")
    parser.add_argument("--batches", type=int, required=True, help="stop once micro-batch N-1 is done")
    parser.add_argument("--fail-task", action="append", default=[], type=int, help="a micro-batch id")
    parser.add_argument("--hold-commit", action="append", default=[], type=int, help="a micro-batch id")
    parser.add_argument("--hold-checkpoint", action="append", default=[], type=int, help="a micro-batch id")
    parser.add_argument("--kill-in-task", type=int, help="a micro-batch id")
    parser.add_argument("--restart", action="store_true", help="a driver restarted after a crash: recover first")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    kill = Kill(os.getpid() if os.getsid(0) == os.getpid() else None, os.path.join(args.markers, "killed"))
    config = ClientConfig.of(args.statehouse)  # the defaults, as docs/spark.md configures the query
    markers = Markers(args.markers, frozenset(args.hold_commit), frozenset(args.hold_checkpoint))
    markers.install()

    user_features.setup(config, args.job)  # idempotent
    if args.restart:
        with StatehouseClient(config) as client:
            MicroBatchCoordinator(client.job(args.job)).recover()
    original = user_features.exactly_once
    user_features.exactly_once = lambda *a, **k: markers.wrap(original(*a, **k))  # start() looks it up there

    spark = local_spark("statehouse-operator-query")
    query = user_features.start(
        spark,
        input_dir=args.input,
        output_dir=args.output,
        checkpoint_dir=args.checkpoint,
        config=config,
        job=args.job,
        available_now=False,
        max_files_per_trigger=1,
        on_partition=functools.partial(on_partition, frozenset(args.fail_task), args.kill_in_task, kill, args.markers),
    )
    last = Path(args.markers, f"done-{args.batches - 1}")
    while not last.exists():
        if query.awaitTermination(0.2):  # raises the query's error if it failed
            raise SystemExit(f"operator_query: the query stopped before micro-batch {args.batches - 1}")
    query.processAllAvailable()  # Spark's own commit of the last batch
    query.stop()
    spark.stop()
    print(f"operator_query: micro-batches up to {args.batches - 1} done", flush=True)


if __name__ == "__main__":
    main()
