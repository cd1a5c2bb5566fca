"""The user-features streaming driver that rescales its replica set between micro-batches, live.

For the live-rescale test (tests/spark/test_spark_live_rescale.py)::

    python -m tests.support.rescale_driver --input D --output D --checkpoint D --statehouse URL1,URL2 --job NAME \\
        [--rescale BATCH:COUNT[:URL,URL,...]]... [--fail-task BATCH]... --markers DIR \\
        [--kill-at before-decide|before-commit --kill-to COUNT] [--hold CALL:COUNT:URL] [--recover]

A first run creates the job; a restart (``--recover``) first finishes or undoes a move a dead predecessor
left (``MicroBatchCoordinator.recover``). Then the query runs over the input, one file per micro-batch.
``--rescale B:M:URLS`` rescales the set to ``M`` replicas (``URLS``: the new set's, in index order) when
micro-batch ``B`` is about to begin, that is after batch ``B-1`` was committed and checkpointed: the cut is
a batch boundary. If the set already has ``M`` replicas (a restarted driver re-running ``B``), nothing is
done.

Faults (``--fail-task`` and ``--hold`` act once, across restarts: marker files in ``--markers``; a kill acts
in the run given it): ``--fail-task B`` fails the first attempt of a task of batch ``B`` after its writes
(Spark retries it); ``--kill-at STEP --kill-to M`` SIGKILLs the driver's session when the rescale to ``M``
is about to send its first decide (the loads done, nothing decided) or its first commit (commit decided, not
applied); ``--hold CALL:M:URL`` stops the rescale to ``M`` once replica ``URL`` answered its
``POST /v1/topology/CALL``, touches ``held-M`` and waits for ``go-M``, so that the test can kill and restart
that replica mid-move. As in tests/support/spark_driver.py, faults wrap things in this process only: the product code
has no test hooks.
"""

from __future__ import annotations

import argparse
import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docs.examples import user_features
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.coordinator import MicroBatchCoordinator
from statehouse.client.spark import BatchContext
from statehouse.client.transport import ReplicaConnection
from tests.support.spark import local_spark
from tests.support.spark_driver import Kill, die

KILL_STEPS = {"before-decide": "/v1/topology/decide", "before-commit": "/v1/topology/commit"}
HOLD_LIMIT = 120.0  # seconds a hold waits for the test's go (a test that died leaves no go)
# Tasks and the driver ride out a replica's restart (a few seconds on a loaded machine).
CLIENT_OPTIONS: dict[str, Any] = {"retries": 12, "backoff": 0.25, "timeout": 120.0}


@dataclass(frozen=True)
class Rescale:
    batch: int
    count: int
    urls: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Rescale:
        batch, count, *urls = text.split(":", 2)
        return cls(int(batch), int(count), tuple(u for u in (urls[0].split(",") if urls else []) if u))


@dataclass(frozen=True)
class Hold:
    call: str
    count: int
    url: str

    @classmethod
    def parse(cls, text: str) -> Hold:
        call, count, url = text.split(":", 2)
        return cls(call, int(count), url.rstrip("/"))


def once(markers: str, name: str) -> bool:
    """True the first time only, across processes and driver restarts."""
    try:
        with open(os.path.join(markers, name), "x"):
            return True
    except FileExistsError:
        return False


def fail_task(batches: frozenset[int], markers: str, ctx: BatchContext) -> None:
    """The pipeline's ``on_partition`` (runs in a Python worker, after the task's writes and reads)."""
    if ctx.batch_id in batches and once(markers, f"task-failed-{ctx.batch_id}"):
        raise RuntimeError(f"injected task failure in micro-batch {ctx.batch_id}")


class Faults:
    """Wraps the driver's client calls: a SIGKILL at a rescale step, a hold after a replica's answer."""

    def __init__(self, markers: str, kill: Kill, kill_at: str | None, kill_to: int | None, hold: Hold | None):
        self.markers, self.kill, self.kill_at, self.kill_to, self.hold = markers, kill, kill_at, kill_to, hold
        self.target: int | None = None  # the replica count of the rescale under way in this process
        self.dying = threading.Lock()

    def install(self) -> None:
        original = ReplicaConnection.json

        def json(conn: ReplicaConnection, method: str, path: str, body: Any = None, *, idempotent: bool = True) -> Any:
            if method == "POST" and self.target is not None:
                self.before(path)
            answer = original(conn, method, path, body, idempotent=idempotent)
            if method == "POST" and self.target is not None:
                self.after(conn.url.rstrip("/"), path)
            return answer

        ReplicaConnection.json = json  # type: ignore[method-assign,assignment]

    def before(self, path: str) -> None:
        if self.kill_at is not None and self.target == self.kill_to and path == KILL_STEPS[self.kill_at]:
            with self.dying:  # LiveRescale sends a step to every replica at once: one thread dies, the others wait
                die(self.kill, self.kill_at)

    def after(self, url: str, path: str) -> None:
        hold = self.hold
        if hold is None or (hold.count, hold.url, f"/v1/topology/{hold.call}") != (self.target, url, path):
            return
        if once(self.markers, f"held-{hold.count}"):
            go = Path(self.markers, f"go-{hold.count}")
            deadline = time.monotonic() + HOLD_LIMIT
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.05)


def recover(config: ClientConfig, job: str) -> None:
    """Finish a decided move, or undo an undecided one, that a dead driver left."""
    with StatehouseClient(config) as client:
        MicroBatchCoordinator(client.job(job)).recover()


def ensure_layout(config: ClientConfig, job: str, step: Rescale, faults: Faults | None = None) -> bool:
    """Rescale to ``step.count`` replicas unless the set has that many already; whether it rescaled."""
    with StatehouseClient(config) as client:
        if len(client.job(job).replicas) == step.count:
            return False
        if faults is not None:
            faults.target = step.count
        try:
            coordinator = MicroBatchCoordinator(client.job(job))
            coordinator.rescale(step.count, list(step.urls) or None)
        finally:
            if faults is not None:
                faults.target = None
    return True


def rescale_before(
    config: ClientConfig, job: str, plan: list[Rescale], faults: Faults | None = None
) -> Callable[[Callable[[Any, int], None]], Callable[[Any, int], None]]:
    """Wraps the ``foreachBatch`` function: a rescale planned for batch ``b`` runs before ``b`` begins."""

    def wrap(run: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        def wrapped(df: Any, batch_id: int) -> None:
            for step in plan:
                if step.batch == batch_id and ensure_layout(config, job, step, faults):
                    print(f"rescale_driver: rescaled to {step.count} before batch {batch_id}", flush=True)
            run(df, batch_id)

        return wrapped

    return wrap


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint location")
    parser.add_argument("--statehouse", required=True, help="replica URLs, comma-separated")
    parser.add_argument("--job", required=True)
    parser.add_argument("--markers", required=True, help="a directory for the faults' once-only markers")
    parser.add_argument("--rescale", action="append", default=[], type=Rescale.parse, help="BATCH:COUNT[:URLS]")
    parser.add_argument("--fail-task", action="append", default=[], type=int, help="a micro-batch id")
    parser.add_argument("--kill-at", choices=KILL_STEPS)
    parser.add_argument("--kill-to", type=int, help="the replica count of the rescale --kill-at applies to")
    parser.add_argument("--hold", type=Hold.parse, help="CALL:COUNT:URL")
    parser.add_argument("--recover", action="store_true", help="a restart: recover, the job exists")
    args = parser.parse_args(argv)
    if (args.kill_at is None) != (args.kill_to is None):
        parser.error("--kill-at and --kill-to go together")

    kill = Kill(os.getpid() if os.getsid(0) == os.getpid() else None, os.path.join(args.markers, "killed"))
    config = ClientConfig.of(args.statehouse, **CLIENT_OPTIONS)
    faults = Faults(args.markers, kill, args.kill_at, args.kill_to, args.hold)
    faults.install()

    if args.recover:
        recover(config, args.job)
    else:
        user_features.setup(config, args.job)
    original = user_features.exactly_once
    wrap = rescale_before(config, args.job, args.rescale, faults)
    user_features.exactly_once = lambda *a, **k: wrap(original(*a, **k))  # start() looks it up in the module

    spark = local_spark("statehouse-live-rescale")
    query = user_features.start(
        spark,
        input_dir=args.input,
        output_dir=args.output,
        checkpoint_dir=args.checkpoint,
        config=config,
        job=args.job,
        available_now=True,
        max_files_per_trigger=1,
        on_partition=functools.partial(fail_task, frozenset(args.fail_task), args.markers) if args.fail_task else None,
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
