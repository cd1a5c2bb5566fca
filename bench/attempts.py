"""Benchmark 7: what exactly-once per task attempt costs per micro-batch, against the direct fenced path.

Two RocksDB replicas (0 and 1 of 2, one local checkpoint directory) serve two jobs with a
reducing sum state. Each micro-batch adds 1 to each of N keys (16 bytes), split over 4
partitions; each partition is a task running in its own thread with its own client, as in
Spark's executors. Two paths, measured in the same run, alternating:

* old (direct fenced): the driver fences a new epoch, tasks send ``job.batch(epoch=e)`` (applied
  at once), then the driver takes the global checkpoint (the coordinator before d14fb63,
  reproduced in :class:`DirectCoordinator`);
* new (staged per task attempt): ``MicroBatchCoordinator.begin``, tasks send
  ``job.batch(attempt=TaskAttempt(...))`` (staged on the server as a redo log plus a
  read-your-writes view), then ``MicroBatchCoordinator.commit``: prepare and commit on every
  replica (the commit replays the staged ops in one transaction), then the checkpoint.

Per micro-batch: HTTP requests and request-body bytes sent (counted in the clients, per
phase), wall time from ``begin`` to the end of the commit without and with the checkpoint,
server CPU per op (both replica processes, their CPU clocks read before and after each phase)
for the staging and the commit phase, and the client process's CPU per op (driver and tasks,
without the checkpoint). The tasks' clients are opened once, before the micro-batches (a
Spark task opens its own; that costs the same on both paths).

    .venv/bin/python -m bench.attempts            # 1,000 / 10,000 / 100,000 ops, 5 runs
    .venv/bin/python -m bench.attempts --quick    # smoke run, a few seconds
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bench.common import Summary, keys, print_header, process_cpu_ns, source_tree, statehouse, table, write_json
from statehouse.client import StatehouseClient
from statehouse.client.attempts import CommitMessage, TaskAttempt
from statehouse.client.coordinator import (
    BatchPlan,
    CheckpointCoordinator,
    GlobalCheckpoint,
    MicroBatchCoordinator,
    StateBehind,
)
from statehouse.client.job import JobClient

STATE = "total"
PATHS = ("old", "new")
JOBS = {"old": "eo-direct", "new": "eo-staged"}
PHASES = ("begin", "tasks", "commit", "checkpoint")


# -- measuring --------------------------------------------------------------------------


class RequestCounter:
    """HTTP requests and request-body bytes the clients send, per phase of the micro-batch.

    Hooks into ``ReplicaConnection``'s urllib3 pool, which every request goes through, so
    retries count too: what goes on the wire, not what the code asks."""

    def __init__(self) -> None:
        self.phase = "setup"
        self.counts: dict[str, list[int]] = {}
        self.sent: list[str] = []  # "phase: METHOD /path" of each request, the job's name as {job}
        self._lock = threading.Lock()  # task threads count at the same time

    def add(self, body_bytes: int, method: str = "", url: str = "") -> None:
        with self._lock:
            slot = self.counts.setdefault(self.phase, [0, 0])
            slot[0] += 1
            slot[1] += body_bytes
            path = url.split("?")[0]
            for name in JOBS.values():
                path = path.replace(f"/jobs/{name}", "/jobs/{job}")
            self.sent.append(f"{self.phase}: {method} {path}")

    def take(self) -> dict[str, list[int]]:
        with self._lock:
            counts, self.counts, self.sent = self.counts, {}, []
            return counts

    def take_sent(self) -> list[str]:
        with self._lock:
            return list(self.sent)

    def instrument(self, client: StatehouseClient) -> None:
        for connection in client.replicas:
            # A private attribute on purpose: the bench must see the real requests, unchanged
            # (every request of the client goes through the pool's urlopen, retries included).
            urlopen = connection._pool.urlopen

            def counted(
                method: str, url: str, body: bytes | None = None, *args: Any, _send: Any = urlopen, **kw: Any
            ) -> Any:
                self.add(len(body or b""), method, url)
                return _send(method, url, body, *args, **kw)

            connection._pool.urlopen = counted  # type: ignore[method-assign,assignment]


@dataclass
class Marks:
    """Wall clock, client CPU and every server's CPU at the start of each phase and at the end."""

    pids: list[int]
    counter: RequestCounter
    points: list[tuple[str, float, float, int]] = field(default_factory=list)

    def mark(self, phase: str) -> None:
        server = sum(process_cpu_ns(pid) for pid in self.pids)
        self.points.append((phase, time.perf_counter(), time.process_time(), server))
        self.counter.phase = phase

    def spans(self) -> dict[str, dict[str, float]]:
        """Per phase: seconds, client CPU seconds, server CPU seconds (a phase marked twice adds up)."""
        out: dict[str, dict[str, float]] = {
            p: {"wall_s": 0.0, "client_cpu_s": 0.0, "server_cpu_s": 0.0} for p in PHASES
        }
        for (phase, wall, client, server), (_next, wall2, client2, server2) in itertools.pairwise(self.points):
            out[phase]["wall_s"] += wall2 - wall
            out[phase]["client_cpu_s"] += client2 - client
            out[phase]["server_cpu_s"] += (server2 - server) / 1e9
        return out


# -- the two protocols ------------------------------------------------------------------


class DirectCoordinator(CheckpointCoordinator):
    """The driver's side before d14fb63: fence a new epoch, tasks write directly with it, then
    checkpoint. The baseline: the same code as then, on today's servers."""

    def anchor(self) -> GlobalCheckpoint:
        for candidate in reversed(self.completed()):
            if "batch_id" in candidate.metadata:
                return candidate
        return self.checkpoint(metadata={"batch_id": -1, "epoch": self.job.epoch()})

    def begin(self, batch_id: int) -> BatchPlan:
        anchor = self.anchor()
        applied = anchor.metadata["batch_id"]
        if batch_id <= applied:
            return BatchPlan(batch_id, None, replay=True)
        if batch_id > applied + 1:
            raise StateBehind(f"state holds micro-batches up to {applied}, not {batch_id - 1}")
        current = self.job.epoch()
        if current > anchor.metadata["epoch"]:
            self.restore(anchor.checkpoint_id)
        return BatchPlan(batch_id, self.job.fence(current + 1), replay=False)

    def commit(self, plan: BatchPlan) -> GlobalCheckpoint | None:
        if plan.replay:
            return None
        return self.checkpoint(metadata={"batch_id": plan.batch_id, "epoch": plan.epoch})


class MarkedCoordinator(MicroBatchCoordinator):
    """The real coordinator; only notes when its commit reaches the checkpoint (after prepare
    and commit), so the commit phase and the checkpoint are timed apart."""

    marks: Marks | None = None

    def checkpoint(
        self, checkpoint_id: int | None = None, *, kind: str = "checkpoint", metadata: dict[str, Any] | None = None
    ) -> GlobalCheckpoint:
        if self.marks is not None:
            self.marks.mark("checkpoint")
        return super().checkpoint(checkpoint_id, kind=kind, metadata=metadata)


_task_ids = itertools.count(1)


def run_task(job: JobClient, share: list[str], epoch: int, partition: int, staged: bool) -> CommitMessage | None:
    """One Spark task: its partition's adds, staged under its attempt (new) or fenced (old)."""
    attempt = TaskAttempt(epoch, partition, len(job.replicas), task=next(_task_ids)) if staged else None
    batch = job.batch(attempt=attempt) if attempt is not None else job.batch(epoch=epoch)
    with batch as writes:
        for key in share:
            writes.add(STATE, key, 1)
    return attempt.message() if attempt is not None else None


@dataclass
class Deployment:
    """The driver's coordinators and the tasks' clients of both jobs, on the two replicas."""

    driver: StatehouseClient
    coordinators: dict[str, DirectCoordinator | MarkedCoordinator]
    task_jobs: dict[str, list[JobClient]]  # per path, one job client per task (its own client)
    pool: ThreadPoolExecutor
    counter: RequestCounter
    pids: list[int]
    batch_ids: dict[str, itertools.count] = field(default_factory=dict)
    fresh_clients: bool = False  # each micro-batch's tasks open their own clients, as Spark's do

    def tasks_jobs(self, path: str, version: int | None) -> tuple[list[JobClient], list[StatehouseClient]]:
        """The tasks' job clients for one micro-batch (and the clients to close after it)."""
        if not self.fresh_clients:
            return self.task_jobs[path], []
        clients = [StatehouseClient(self.driver.config) for _ in self.task_jobs[path]]
        jobs = []
        for client in clients:
            self.counter.instrument(client)
            client.replicas.learn_cached()
            try:  # a task is handed the version its driver began the batch under (the fence answer names it)
                jobs.append(client.job(JOBS[path], version=version))  # type: ignore[call-arg,unused-ignore]
            except TypeError:  # a source tree from before (--before): no such parameter
                jobs.append(client.job(JOBS[path]))
        return jobs, clients

    def micro_batch(self, path: str, key_list: list[str]) -> dict[str, Any]:
        """One micro-batch of ``len(key_list)`` adds through ``path``; its cost per phase."""
        coordinator = self.coordinators[path]
        partitions = len(self.task_jobs[path])
        shares = [key_list[p::partitions] for p in range(partitions)]
        marks = Marks(self.pids, self.counter)
        self.counter.take()
        marks.mark("begin")
        plan = coordinator.begin(next(self.batch_ids.setdefault(path, itertools.count())))
        assert plan.epoch is not None and not plan.replay
        marks.mark("tasks")
        jobs, clients = self.tasks_jobs(path, coordinator.job.replicas.version)
        futures = [
            self.pool.submit(run_task, job, share, plan.epoch, p, path == "new")
            for p, (job, share) in enumerate(zip(jobs, shares, strict=True))
        ]
        messages = [m for m in (f.result() for f in futures) if m is not None]
        for client in clients:
            client.close()
        marks.mark("commit")
        if isinstance(coordinator, MarkedCoordinator):
            coordinator.marks = marks  # marks "checkpoint" once prepare and commit are done
            coordinator.commit(plan, messages)
            coordinator.marks = None
        else:
            marks.mark("checkpoint")  # the old path commits nothing before its checkpoint
            coordinator.commit(plan)
        marks.mark("end")
        sent = self.counter.take_sent()
        counts = self.counter.take()
        spans = marks.spans()
        return {
            "ops": len(key_list),
            "requests": {p: counts.get(p, [0, 0])[0] for p in PHASES},
            "sent": sent,
            "bytes": {p: counts.get(p, [0, 0])[1] for p in PHASES},
            "phases": spans,
            "latency_s": sum(spans[p]["wall_s"] for p in ("begin", "tasks", "commit")),
            "latency_ckpt_s": sum(s["wall_s"] for s in spans.values()),
        }


@contextlib.contextmanager
def deployment(partitions: int, replicas: int = 2, fresh_clients: bool = False) -> Iterator[Deployment]:
    """RocksDB replicas sharing a local checkpoint directory, both jobs created, clients open
    (``fresh_clients``: each micro-batch's tasks open their own, as Spark's do)."""
    shared = tempfile.mkdtemp(prefix="statehouse-bench-attempts-")
    env = {"STATEHOUSE_REPLICA_COUNT": str(replicas), "STATEHOUSE_CHECKPOINT_DIR": shared}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, shared, True)
        servers = [
            stack.enter_context(statehouse("rocksdb", {**env, "STATEHOUSE_REPLICA_INDEX": str(i)}))
            for i in range(replicas)
        ]
        urls = [s.url for s in servers]
        counter = RequestCounter()
        driver = stack.enter_context(StatehouseClient(urls))
        counter.instrument(driver)
        coordinators: dict[str, DirectCoordinator | MarkedCoordinator] = {}
        task_jobs: dict[str, list[JobClient]] = {path: [] for path in PATHS}
        for path in PATHS:
            job = driver.create_job(JOBS[path], max_parallelism=128)
            job.register(STATE, "reducing", function="sum")
            coordinators[path] = DirectCoordinator(job) if path == "old" else MarkedCoordinator(job)
        for _ in range(partitions):
            client = stack.enter_context(StatehouseClient(urls))
            counter.instrument(client)
            for path in PATHS:
                task_job = client.job(JOBS[path])
                if not fresh_clients:
                    task_job._key_types[STATE] = "string"  # skip the describe round trip, as batch_ops does
                task_jobs[path].append(task_job)
        pool = stack.enter_context(ThreadPoolExecutor(partitions, thread_name_prefix="task"))
        pids = [s.process.pid for s in servers]
        yield Deployment(driver, coordinators, task_jobs, pool, counter, pids, fresh_clients=fresh_clients)


def check_totals(dep: Deployment, key_list: list[str], expected: int) -> None:
    """Both paths counted every add exactly once (a bench of a wrong protocol measures nothing)."""
    for path in PATHS:
        job = dep.coordinators[path].job
        with job.batch() as reads:
            pending = [reads.get(STATE, k) for k in key_list]
        wrong = sum(p.value != expected for p in pending)
        if wrong:
            raise AssertionError(f"{path}: {wrong} of {len(key_list)} keys do not hold {expected}")


# -- reporting --------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]]) -> dict[str, Summary]:
    """Medians-to-be of the figures reported per micro-batch."""
    ops = runs[0]["ops"]

    def per_op_us(phase: str, what: str) -> Summary:
        return Summary([r["phases"][phase][what] / ops * 1e6 for r in runs])

    return {
        "requests": Summary([sum(r["requests"].values()) for r in runs]),
        "requests_no_ckpt": Summary([sum(v for p, v in r["requests"].items() if p != "checkpoint") for r in runs]),
        "kb": Summary([sum(r["bytes"].values()) / 1024 for r in runs]),
        "latency_ms": Summary([r["latency_s"] * 1e3 for r in runs]),
        "latency_ckpt_ms": Summary([r["latency_ckpt_s"] * 1e3 for r in runs]),
        "ops_per_s": Summary([ops / r["latency_s"] for r in runs]),
        "server_stage_us": per_op_us("tasks", "server_cpu_s"),
        "server_commit_us": per_op_us("commit", "server_cpu_s"),
        "server_total_us": Summary(
            [sum(r["phases"][p]["server_cpu_s"] for p in ("begin", "tasks", "commit")) / ops * 1e6 for r in runs]
        ),
        "server_ckpt_ms": Summary([r["phases"]["checkpoint"]["server_cpu_s"] * 1e3 for r in runs]),
        "client_us": Summary(
            [sum(r["phases"][p]["client_cpu_s"] for p in ("begin", "tasks", "commit")) / ops * 1e6 for r in runs]
        ),
    }


COLUMNS = [
    ("requests", "requests: all (excl. ckpt)", 0),
    ("kb", "KiB sent", 0),
    ("latency_ms", "begin→commit ms", 1),
    ("latency_ckpt_ms", "incl. ckpt ms", 1),
    ("ops_per_s", "ops/s (excl. ckpt)", 0),
    ("server_stage_us", "server CPU staging µs/op", 2),
    ("server_commit_us", "server CPU commit µs/op", 2),
    ("server_total_us", "server CPU total µs/op", 2),
    ("client_us", "client CPU µs/op", 2),
]


def rows_for(size: int, old: dict[str, Summary], new: dict[str, Summary]) -> list[list[Any]]:
    rows = []
    for path, s in (("old (direct, fenced)", old), ("new (staged attempts)", new)):
        cells = []
        for key, _header, digits in COLUMNS:
            cell = s[key].fmt(digits=digits)
            if key == "server_commit_us" and s is old:
                cell = "-"  # the old path has no commit phase (its span is the time between two marks)
            elif key == "requests":
                cell = f"{s['requests'].median:,.0f} ({s['requests_no_ckpt'].median:,.0f})"
            cells.append(cell)
        rows.append([f"{size:,}", path, *cells])
    ratio = []
    for key, _header, _digits in COLUMNS:
        base = old[key].median
        ratio.append(f"{new[key].median / base:.2f}x" if base and key != "server_commit_us" else "-")
    rows.append([f"{size:,}", "**new/old**", *ratio])
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="micro-batches measured per path and size")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1_000, 10_000, 100_000])
    p.add_argument("--partitions", type=int, default=4, help="tasks (task attempts) per micro-batch")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured micro-batches per path and size first")
    p.add_argument("--replicas", type=int, default=2, help="replicas (the Spark bench's job runs on one)")
    p.add_argument(
        "--fresh-clients",
        action="store_true",
        help="each micro-batch's tasks open their own clients in this process, as Spark's tasks in reused workers",
    )
    p.add_argument("--routes", action="store_true", help="list the requests of each path's last micro-batch")
    p.add_argument("--before", help="a source tree to run the same way afterwards (before/after; request counts)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1,000 ops, 1 run")
    p.add_argument("--json", help="write the results here")
    cfg = p.parse_args(argv)
    if cfg.quick:
        cfg.sizes, cfg.runs = [1_000], 1
    return cfg


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header("Exactly-once per task attempt: protocol cost per micro-batch (median of runs, min-max)")
    load = os.getloadavg()[0]
    print(f"load average (1 min) at start: {load:.2f}")
    results: list[dict[str, Any]] = []
    rows: list[list[Any]] = []
    print(f"replicas: {cfg.replicas}, tasks: {cfg.partitions}, fresh task clients: {cfg.fresh_clients}")
    with deployment(cfg.partitions, cfg.replicas, cfg.fresh_clients) as dep:
        for index, size in enumerate(cfg.sizes):
            key_list = keys(size, prefix=f"s{index}")  # 16 bytes; a fresh set per size
            runs: dict[str, list[dict[str, Any]]] = {path: [] for path in PATHS}
            for n in range(cfg.warmup + cfg.runs):
                # Alternate which path goes first, so drift on the shared machine hits both alike.
                for path in PATHS if n % 2 == 0 else PATHS[::-1]:
                    run = dep.micro_batch(path, key_list)
                    if n >= cfg.warmup:
                        runs[path].append(run)
            check_totals(dep, key_list, cfg.warmup + cfg.runs)
            summaries = {path: summarize(runs[path]) for path in PATHS}
            for line in rows_for(size, summaries["old"], summaries["new"]):
                rows.append(line)
                print("  " + " | ".join(str(c) for c in line), flush=True)
            for path in PATHS:
                s = summaries[path]
                requests = {p: Summary([r["requests"][p] for r in runs[path]]).median for p in PHASES}
                print(
                    f"  {size:,} {path}: requests per phase {requests}, server CPU in the checkpoint "
                    f"{s['server_ckpt_ms'].fmt(digits=1)} ms",
                    flush=True,
                )
                if cfg.routes:
                    for line in collections.Counter(runs[path][-1]["sent"]).items():
                        print(f"      {line[1]} x {line[0]}")
                results.append(
                    {
                        "ops": size,
                        "path": path,
                        "summary": {k: v.to_dict() for k, v in s.items()},
                        "runs": runs[path],
                    }
                )
    end_load = os.getloadavg()[0]
    print(f"load average (1 min) at end: {end_load:.2f}")
    print()
    print(table(["ops/micro-batch", "path", *(h for _k, h, _d in COLUMNS)], rows))
    write_json(cfg.json, {"benchmark": "attempts", "load": [load, end_load], "results": results})
    if cfg.before:
        _run_before(cfg.before, [a for a in (argv if argv is not None else sys.argv[1:])])
    return {"results": results, "load": [load, end_load]}


def _run_before(tree: str, argv: list[str]) -> None:
    """This bench again, in a fresh process running ``tree``'s statehouse (client and servers)."""
    args, skip = [], False
    for arg in argv:
        if skip or arg == "--before" or arg.startswith("--before="):
            skip = arg == "--before"
            continue
        args.append(arg)
    print(f"\nbefore: {tree}", flush=True)
    with source_tree(tree) as env:
        subprocess.run([sys.executable, "-m", "bench.attempts", *args], env={**os.environ, **env}, check=True)


if __name__ == "__main__":
    main()
