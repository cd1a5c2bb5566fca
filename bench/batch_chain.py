"""The replica's part of a Spark micro-batch's critical path, live, without Spark.

The exactly-once job of bench 9 (``spark_columnar``, path ``columnar``) is a chain: the driver's
``begin`` (the epoch fenced), the tasks' columnar requests (each task its own client and
attempt, its partition's Arrow batches grouped per user and sent as ``add_get_states`` of two
reducing sums), then the driver's commit of the winning attempts and the batch's checkpoint
(``MicroBatchCoordinator.commit``). Spark waits for each link. Here the same requests come from
threads of this process, one per task, over micro-batches of ``--events`` events spread
uniformly over ``--users`` users (hash-partitioned over ``--tasks`` tasks, ``--batch-rows``
events per Arrow batch, as Spark's ``maxRecordsPerBatch``), and each link is timed: wall
milliseconds and the replica's CPU milliseconds (its CPU clock, every thread) per link, medians
over the timed micro-batches, and the whole chain's means (a heap checkpoint that writes a new
base, or RocksDB's compactions, cost some micro-batches more than most).

What the whole job adds to the no-state job per micro-batch (bench 9's rows/s) is these links
plus Spark's side of the tasks (its Arrow exchange with the Python workers, the client's
grouping); what this bench does not time is Spark.

``--runs N`` repeats every configuration on a fresh replica (medians over the rounds);
``--before DIR`` runs the same micro-batches against a server of the source tree ``DIR`` (``git
worktree add --detach /tmp/base <commit>``) in the same rounds, the order alternating.

    .venv/bin/python -m bench.batch_chain --users 10000,1000000 --backends heap,rocksdb
    .venv/bin/python -m bench.batch_chain --users 10000 --backends heap --runs 3 --before /tmp/base
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.common import print_header, process_cpu_ns, source_tree, statehouse, table, write_json
from statehouse.client import StatehouseClient
from statehouse.client.attempts import CommitMessage, TaskAttempt
from statehouse.client.coordinator import BatchPlan, MicroBatchCoordinator
from statehouse.client.global_checkpoints import GlobalCheckpoint

JOB = "chain"
STATES = {
    "total": {"kind": "reducing", "function": "sum", "value_type": "float64"},
    "events": {"kind": "reducing", "function": "sum", "value_type": "int64"},
}
LINKS = ("begin", "tasks", "commit", "checkpoint")


class TimedCoordinator(MicroBatchCoordinator):
    """The coordinator with the end of its commit (before the checkpoint) marked."""

    mark: Callable[[str], None] | None = None

    def _checkpoint_batch(self, plan: BatchPlan) -> GlobalCheckpoint:
        if self.mark is not None:
            self.mark("checkpoint")
        return super()._checkpoint_batch(plan)


def micro_batches(
    names: np.ndarray, events: int, tasks: int, batch_rows: int, seed: int, totals: np.ndarray, counts: np.ndarray
) -> Any:
    """Each micro-batch's input as the tasks see it: per task, its Arrow batches grouped per user
    (the sums and counts bench 9's step sends); every event also added to ``totals`` and
    ``counts`` (the oracle)."""
    rng = np.random.default_rng(seed)
    users = len(names)
    task_of = np.arange(users) % tasks  # a user's task: its partition
    while True:
        drawn = rng.integers(0, users, events)
        amounts = rng.integers(1, 10_000, events) / 100
        np.add.at(totals, drawn, amounts)
        np.add.at(counts, drawn, 1)
        per_task = []
        for task in range(tasks):
            mine = task_of[drawn] == task
            frame = pd.DataFrame({"user_id": names[drawn[mine]], "amount": amounts[mine]})
            per_task.append(
                [
                    frame.iloc[i : i + batch_rows].groupby("user_id", sort=False)["amount"].agg(["sum", "size"])
                    for i in range(0, len(frame), batch_rows)
                ]
            )
        yield per_task


def run(backend: str, users: int, cfg: argparse.Namespace, tree: str | None = None) -> dict[str, Any]:
    """Warm-up and timed micro-batches on a fresh replica (``tree``: its server runs that source
    tree's statehouse): wall and replica CPU per link."""
    workdir = Path(tempfile.mkdtemp(prefix="statehouse-bench-chain-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        env = {"STATEHOUSE_CHECKPOINT_DIR": str(workdir / "checkpoints")}
        if tree:
            env.update(stack.enter_context(source_tree(tree)))
        server = stack.enter_context(statehouse(backend, env, workdir))
        driver = StatehouseClient([server.url])
        job = driver.create_job(JOB, 128)
        for state, descriptor in STATES.items():
            job.register(state, **descriptor)
        coordinator = TimedCoordinator(driver.job(JOB))
        task_clients = [StatehouseClient([server.url]) for _ in range(cfg.tasks)]
        task_ids = itertools.count(1)

        def task(index: int, epoch: int, frames: list[pd.DataFrame]) -> CommitMessage:
            attempt = TaskAttempt(epoch, index, 1, task=next(task_ids))
            columns = task_clients[index].job(JOB).columns(attempt)
            for grouped in frames:
                columns.add_get_states({"total": grouped["sum"], "events": grouped["size"]}, grouped.index)
            return attempt.message()

        walls: dict[str, list[float]] = {link: [] for link in LINKS}
        cpus: dict[str, list[float]] = {link: [] for link in LINKS}
        names = np.array([f"user-{u}" for u in range(users)], dtype=object)
        totals, counts = np.zeros(users), np.zeros(users, np.int64)
        inputs = micro_batches(names, cfg.events, cfg.tasks, cfg.batch_rows, cfg.seed, totals, counts)
        with ThreadPoolExecutor(cfg.tasks) as pool:
            for batch_id in range(cfg.warmup + cfg.batches):
                per_task = next(inputs)
                marks: list[tuple[str, float, int]] = []

                def mark(link: str, marks: list[tuple[str, float, int]] = marks) -> None:
                    marks.append((link, time.perf_counter(), process_cpu_ns(server.process.pid)))

                coordinator.mark = mark
                mark("begin")
                plan = coordinator.begin(batch_id)
                assert plan.epoch is not None and not plan.replay
                mark("tasks")
                messages = list(pool.map(task, range(cfg.tasks), itertools.repeat(plan.epoch), per_task))
                mark("commit")
                coordinator.commit(plan, messages)
                mark("end")
                if batch_id >= cfg.warmup:
                    for (link, wall, cpu), (_next, wall_after, cpu_after) in itertools.pairwise(marks):
                        walls[link].append(wall_after - wall)
                        cpus[link].append((cpu_after - cpu) / 1e9)
        check(driver, names, totals, counts)
        for client in (driver, *task_clients):
            client.close()
    return {
        "tree": "before" if tree else "after",
        "backend": backend,
        "users": users,
        "wall_ms": {link: statistics.median(walls[link]) * 1e3 for link in LINKS},
        "cpu_ms": {link: statistics.median(cpus[link]) * 1e3 for link in LINKS},
        "chain_wall_ms": sum(statistics.median(walls[link]) for link in LINKS) * 1e3,
        "chain_cpu_ms": sum(statistics.median(cpus[link]) for link in LINKS) * 1e3,
        # A checkpoint that writes a new base (heap) or a compaction's files costs more than most:
        # the means over the micro-batches, beside the medians.
        "mean_wall_ms": statistics.fmean(map(sum, zip(*walls.values(), strict=True))) * 1e3,
        "mean_cpu_ms": statistics.fmean(map(sum, zip(*cpus.values(), strict=True))) * 1e3,
        "batches": cfg.batches,
        "samples_ms": {link: [round(w * 1e3, 2) for w in walls[link]] for link in LINKS},
    }


def summary(runs: list[dict[str, Any]], events: int) -> list[str]:
    """One configuration's cells: medians over its rounds, each wall ms (replica CPU ms)."""

    def median(field: str, link: str | None = None) -> float:
        return statistics.median(r[field][link] if link else r[field] for r in runs)

    cells = [f"{median('wall_ms', link):.1f} ({median('cpu_ms', link):.1f})" for link in LINKS]
    cells.append(f"{median('chain_wall_ms'):.1f} ({median('chain_cpu_ms'):.1f})")
    cells.append(f"{median('mean_wall_ms'):.1f} ({median('mean_cpu_ms'):.1f})")
    cells.append(f"{median('mean_cpu_ms') * 1e3 / events:.2f}")
    return cells


def check(driver: StatehouseClient, names: np.ndarray, totals: np.ndarray, counts: np.ndarray) -> None:
    """Every user's state read back against the sums of its events (users without events: none)."""
    stored = driver.job(JOB).columns().get_states(list(STATES), names)
    seen = counts > 0
    events = stored["events"].to_numpy(dtype=float, na_value=0)
    total = stored["total"].to_numpy(dtype=float, na_value=0)
    if not (np.array_equal(events, counts) and np.allclose(total[seen], totals[seen]) and not total[~seen].any()):
        raise AssertionError("the replica's sums and counts differ from the events'")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", type=lambda s: s.split(","), default=["heap", "rocksdb"])
    p.add_argument("--users", type=lambda s: [int(x) for x in s.split(",")], default=[10_000, 1_000_000])
    p.add_argument("--events", type=int, default=50_000, help="events per micro-batch")
    p.add_argument("--tasks", type=int, default=2, help="Spark tasks (shuffle partitions) per micro-batch")
    p.add_argument("--batch-rows", type=int, default=10_000, help="events per Arrow batch of a task")
    p.add_argument("--batches", type=int, default=20, help="timed micro-batches")
    p.add_argument("--warmup", type=int, default=3, help="micro-batches before the timed ones")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", type=int, default=1, help="rounds (a fresh replica per configuration and tree)")
    p.add_argument("--before", help="a source tree whose server runs the same micro-batches, in the same rounds")
    p.add_argument("--quick", action="store_true", help="smoke run: 3 micro-batches of 500 events, 100 users")
    p.add_argument("--json")
    cfg = p.parse_args(argv)
    if cfg.quick:
        cfg.users, cfg.events, cfg.batches, cfg.warmup, cfg.batch_rows = [100], 500, 3, 1, 200
    return cfg


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header("The replica's part of a micro-batch's critical path (begin, tasks, commit, checkpoint)")
    results = []
    trees = [None, cfg.before] if cfg.before else [None]
    for round_ in range(cfg.runs):
        for backend in cfg.backends:
            for users in cfg.users:
                for tree in trees if round_ % 2 == 0 else trees[::-1]:  # the order alternates per round
                    result = run(backend, users, cfg, tree) | {"round": round_}
                    results.append(result)
                    label = f"round {round_ + 1} {backend} {users:,} users {result['tree']}"
                    print(f"  {label}: {result['mean_wall_ms']:.1f} ms per micro-batch", flush=True)
    headers = ["tree", "backend", "users", *(f"{link} ms (CPU)" for link in LINKS), "chain ms (CPU)"]
    headers += ["mean chain ms (CPU)", "mean CPU µs per event"]
    rows = []
    for (tree, backend, users), runs in itertools.groupby(
        sorted(results, key=lambda r: (r["backend"], r["users"], r["tree"])),
        key=lambda r: (r["tree"], r["backend"], r["users"]),
    ):
        rows.append([tree, backend, f"{users:,}", *summary(list(runs), cfg.events)])
    print(f"\nmedians of {cfg.runs} round(s)")
    print(table(headers, rows))
    write_json(cfg.json, {"benchmark": "batch_chain", "config": vars(cfg), "results": results})
    return {"results": results}


if __name__ == "__main__":
    main()
