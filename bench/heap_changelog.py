"""Benchmark 25: heap checkpoints as a changelog against full snapshots, in process.

A heap job of ``--keys`` keys (a value state, 100-byte values) takes a checkpoint, then
``--checkpoints`` more, each after ``--changed`` of its keys were rewritten (a micro-batch's
writes, through the columnar path). For each format (``STATEHOUSE_INCREMENTAL_CHECKPOINTS``
on: a changelog; off: the full format): the CPU of the process per checkpoint (every thread:
the freeze, the write, the upload to a local directory), the bytes written, and a restore of the
last checkpoint into a fresh heap replica (CPU and bytes read), which a changelog pays for by
reading its base and deltas.

    .venv/bin/python -m bench.heap_changelog --keys 1000000 --checkpoints 8 --changed 0.05
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from typing import Any

from bench.common import Summary, print_header, table, write_json
from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing.manager import CheckpointManager
from statehouse.backends.heap.store import HeapStore
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.stored.descriptors import StateDescriptor

JOB = "changelog"
FORMATS = {"changelog": True, "full": False}


def _write(job: Any, keys: list[str], rng: random.Random) -> None:
    with job.transaction() as tx:
        state = tx.value("v")
        for start in range(0, len(keys), 50_000):
            chunk = keys[start : start + 50_000]
            state.update_many(state.locate_many(chunk, [""] * len(chunk)), [rng.randbytes(50).hex() for _ in chunk])


def measure(incremental: bool, cfg: argparse.Namespace, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    workdir = tempfile.mkdtemp(prefix="bench-changelog-")
    storage = open_storage(f"{workdir}/checkpoints")
    catalog = JobCatalog(HeapStore(incremental_checkpoints=incremental))
    manager = CheckpointManager(catalog, storage, num_retained=2)
    try:
        job, _ = catalog.create(JOB, 128)
        job.register_state(StateDescriptor("v", "value"))
        keys = [f"user-{i}" for i in range(cfg.keys)]
        _write(job, keys, rng)
        cpu, written = [], []
        for checkpoint_id in range(1, cfg.checkpoints + 2):
            if checkpoint_id > 1:
                _write(job, rng.sample(keys, int(cfg.keys * cfg.changed)), rng)
            started = time.process_time()
            manager.trigger(JOB, checkpoint_id)
            info = manager.wait(JOB, checkpoint_id, 600)
            manager.complete(JOB, checkpoint_id)
            if checkpoint_id > 1:  # the first is a base either way
                cpu.append((time.process_time() - started) * 1000)
                written.append(info.bytes_uploaded)
        last = cfg.checkpoints + 1
        fresh = JobCatalog(HeapStore(incremental_checkpoints=incremental))
        restorer = CheckpointManager(fresh, storage)
        started, wall = time.process_time(), time.perf_counter()
        restored = restorer.restore(JOB, last)
        restore_cpu, restore_wall = time.process_time() - started, time.perf_counter() - wall
        restorer.close()
        fresh.close()
        return {
            "checkpoint_ms_cpu": cpu,
            "checkpoint_bytes": written,
            "restore_s_cpu": restore_cpu,
            "restore_s_wall": restore_wall,
            "restore_bytes_read": restored.bytes_read,
        }
    finally:
        manager.close()
        catalog.close()
        shutil.rmtree(workdir, ignore_errors=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--checkpoints", type=int, default=8, help="checkpoints after the first, each after a batch")
    p.add_argument("--changed", type=float, default=0.05, help="fraction of keys a batch rewrites")
    p.add_argument("--json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header("Heap checkpoints: a changelog against full snapshots (in process)")
    results = []
    for name, incremental in FORMATS.items():
        runs = [measure(incremental, cfg, seed) for seed in range(cfg.runs)]
        results.append(
            {
                "format": name,
                "checkpoint_ms_cpu": Summary([ms for r in runs for ms in r["checkpoint_ms_cpu"]]),
                "checkpoint_mb": Summary([b / 1e6 for r in runs for b in r["checkpoint_bytes"]]),
                "restore_s_cpu": Summary([r["restore_s_cpu"] for r in runs]),
                "restore_s_wall": Summary([r["restore_s_wall"] for r in runs]),
                "restore_mb_read": Summary([r["restore_bytes_read"] / 1e6 for r in runs]),
            }
        )
    headers = ["format", "keys", "changed per checkpoint", "checkpoint ms CPU", "checkpoint MB"]
    headers += ["restore s CPU", "restore s wall", "restore MB read"]
    rows = [
        [
            r["format"],
            f"{cfg.keys:,}",
            f"{cfg.changed:.0%}",
            r["checkpoint_ms_cpu"].fmt(digits=1),
            r["checkpoint_mb"].fmt(digits=2),
            r["restore_s_cpu"].fmt(digits=2),
            r["restore_s_wall"].fmt(digits=2),
            r["restore_mb_read"].fmt(digits=1),
        ]
        for r in results
    ]
    print(table(headers, rows))
    results = [{k: v.to_dict() if isinstance(v, Summary) else v for k, v in r.items()} for r in results]
    out = {"config": vars(cfg), "results": results}
    write_json(cfg.json, out)
    return out


if __name__ == "__main__":
    main()
