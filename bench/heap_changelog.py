"""Benchmark 25: heap checkpoints as a changelog against full snapshots, in process.

A heap job of ``--keys`` keys (a value state, 100-byte values) takes a checkpoint, then
``--checkpoints`` more, each after ``--changed`` of its keys were rewritten (a micro-batch's
writes, through the columnar path). For each format (``STATEHOUSE_INCREMENTAL_CHECKPOINTS``
on: a changelog; off: the full format): the CPU of the process per checkpoint (every thread:
the freeze, the write, the upload to a local directory), the bytes written, and a restore of the
last checkpoint into a fresh heap replica (CPU, bytes read and read requests), which a changelog pays for by
reading its base and deltas.

    .venv/bin/python -m bench.heap_changelog --keys 1000000 --checkpoints 8 --changed 0.05

``--s3``: the checkpoints in SeaweedFS S3 (started here) instead of a local directory, where each
read request pays a round trip.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import tempfile
import time
from typing import Any

from bench.common import Summary, print_header, s3_settings, table, write_json
from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing.manager import CheckpointManager
from statehouse.backends.heap.store import HeapStore
from statehouse.snapshots.storage import CheckpointStorage, open_storage
from statehouse.snapshots.stored.descriptors import StateDescriptor

JOB = "changelog"
FORMATS = {"changelog": True, "full": False}


def _write(job: Any, keys: list[str], rng: random.Random) -> None:
    with job.transaction() as tx:
        state = tx.value("v")
        for start in range(0, len(keys), 50_000):
            chunk = keys[start : start + 50_000]
            state.update_many(state.locate_many(chunk, [""] * len(chunk)), [rng.randbytes(50).hex() for _ in chunk])


def _storage(workdir: str, s3: dict[str, str] | None) -> CheckpointStorage:
    if s3 is None:
        return open_storage(f"{workdir}/checkpoints")
    location = f"{s3['STATEHOUSE_CHECKPOINT_DIR']}/{os.path.basename(workdir)}"
    return open_storage(location, s3_endpoint_url=s3["STATEHOUSE_S3_ENDPOINT_URL"])


def measure(incremental: bool, cfg: argparse.Namespace, seed: int, s3: dict[str, str] | None) -> dict[str, Any]:
    rng = random.Random(seed)
    workdir = tempfile.mkdtemp(prefix="bench-changelog-")
    storage = _storage(workdir, s3)
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
        started, wall, reads = time.process_time(), time.perf_counter(), storage.reads
        restored = restorer.restore(JOB, last)
        restore_cpu, restore_wall = time.process_time() - started, time.perf_counter() - wall
        reads = storage.reads - reads
        restorer.close()
        fresh.close()
        return {
            "checkpoint_ms_cpu": cpu,
            "checkpoint_bytes": written,
            "restore_s_cpu": restore_cpu,
            "restore_s_wall": restore_wall,
            "restore_bytes_read": restored.bytes_read,
            "restore_reads": reads,
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
    p.add_argument("--s3", action="store_true", help="checkpoints in SeaweedFS S3 started here")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated: changelog, full")
    p.add_argument("--json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header("Heap checkpoints: a changelog against full snapshots (in process)")
    results = []
    with contextlib.ExitStack() as stack:
        s3 = None
        if cfg.s3:
            s3 = s3_settings(stack, None, "changelog")
            os.environ.update({k: v for k, v in s3.items() if k.startswith("AWS_")})
        for name in cfg.formats.split(","):
            runs = [measure(FORMATS[name], cfg, seed, s3) for seed in range(cfg.runs)]
            results.append(
                {
                    "format": name,
                    "checkpoint_ms_cpu": Summary([ms for r in runs for ms in r["checkpoint_ms_cpu"]]),
                    "checkpoint_mb": Summary([b / 1e6 for r in runs for b in r["checkpoint_bytes"]]),
                    "restore_s_cpu": Summary([r["restore_s_cpu"] for r in runs]),
                    "restore_s_wall": Summary([r["restore_s_wall"] for r in runs]),
                    "restore_mb_read": Summary([r["restore_bytes_read"] / 1e6 for r in runs]),
                    "restore_reads": Summary([r["restore_reads"] for r in runs]),
                }
            )
    headers = ["format", "keys", "changed per checkpoint", "checkpoint ms CPU", "checkpoint MB"]
    headers += ["restore s CPU", "restore s wall", "restore MB read", "restore reads"]
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
            r["restore_reads"].fmt(digits=0),
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
