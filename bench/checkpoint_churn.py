"""What a micro-batch's incremental checkpoint uploads in the steady state, by RocksDB level shape.

One RocksDB replica per shape (local checkpoint storage: bytes are the measure, the upload's time
is S3's), a reducing state prefilled with ``--keys`` keys through the columnar door and
checkpointed, then ``--batches`` micro-batches of ``--batch`` adds to keys drawn uniformly over the
state, a checkpoint after each, as a Spark query checkpoints after every micro-batch. A batch
changes about ``--batch`` entries, but every checkpoint flushes a level-0 file and compactions
rewrite the files they merge into, which the next checkpoint uploads again: the bytes per batch
against the bytes the batch changed is the churn. Shapes are ``TARGET/BASE`` in MiB
(``STATEHOUSE_ROCKSDB_TARGET_FILE_BYTES`` / ``STATEHOUSE_ROCKSDB_LEVEL_BASE_BYTES``).

    .venv/bin/python -m bench.checkpoint_churn --keys 1000000 --batches 80 --shapes 64/256,4/16,2/4
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import print_header, statehouse, table, write_json
from bench.state import dir_bytes, mb
from statehouse.client import StatehouseClient
from statehouse.client.coordinator import CheckpointCoordinator

JOB, STATE = "churn", "total"
FILL_ROWS = 50_000  # rows per columnar request of the fill


def shape_env(shape: str) -> dict[str, str]:
    target, base = (int(x) << 20 for x in shape.split("/"))
    return {"STATEHOUSE_ROCKSDB_TARGET_FILE_BYTES": str(target), "STATEHOUSE_ROCKSDB_LEVEL_BASE_BYTES": str(base)}


def measure(shape: str, keys: int, batch: int, batches: int, seed: int) -> dict[str, Any]:
    """Fill, checkpoint, then ``batches`` batches with a checkpoint each: bytes and seconds per checkpoint."""
    workdir = Path(tempfile.mkdtemp(prefix="statehouse-bench-churn-"))
    env = {"STATEHOUSE_CHECKPOINT_DIR": str(workdir / "checkpoints"), **shape_env(shape)}
    try:
        with statehouse("rocksdb", env, workdir) as server, StatehouseClient([server.url]) as client:
            job = client.create_job(JOB, 128)
            job.register(STATE, "reducing", function="sum")
            state = job.reducing_state(STATE)
            names = np.array([f"user-{i}" for i in range(keys)], dtype=object)
            for start in range(0, keys, FILL_ROWS):
                rows = names[start : start + FILL_ROWS]
                state.add_many(rows, np.ones(len(rows)))
            coordinator = CheckpointCoordinator(job)
            fill_bytes = coordinator.checkpoint().bytes_uploaded
            rng = np.random.default_rng(seed)
            uploaded, seconds = [], []
            for _ in range(batches):
                state.add_many(names[rng.integers(0, keys, batch)], np.ones(batch))
                started = time.perf_counter()
                uploaded.append(coordinator.checkpoint().bytes_uploaded)
                seconds.append(time.perf_counter() - started)
            files = sorted((workdir / "data" / JOB).glob("*.sst"))
            return {
                "shape": shape,
                "fill_bytes": fill_bytes,
                "state_bytes": dir_bytes(workdir / "data" / JOB),
                "table_files": len(files),
                "uploaded": uploaded,
                "seconds": seconds,
            }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000, help="keys the state is prefilled with")
    p.add_argument("--batch", type=int, default=10_000, help="adds per micro-batch, to uniformly drawn keys")
    p.add_argument("--batches", type=int, default=80)
    p.add_argument("--shapes", type=lambda s: s.split(","), default=["64/256", "4/16", "2/4"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header(f"Incremental checkpoint per micro-batch by RocksDB level shape ({cfg.keys:,} keys)")
    results = []
    with contextlib.ExitStack():
        for shape in cfg.shapes:
            r = measure(shape, cfg.keys, cfg.batch, cfg.batches, cfg.seed)
            results.append(r)
            print(f"  {shape}: mean {mb(statistics.fmean(r['uploaded']))} per batch", flush=True)
    baseline = statistics.fmean(results[0]["uploaded"]) or 1
    rows = []
    for r in results:
        up, last = r["uploaded"], r["uploaded"][-(len(r["uploaded"]) // 4 or 1) :]
        rows.append(
            [
                r["shape"],
                mb(r["fill_bytes"]),
                r["table_files"],
                mb(statistics.fmean(up)),
                mb(statistics.fmean(last)),
                mb(statistics.median(up)),
                mb(max(up)),
                f"{statistics.fmean(up) / baseline:.2f}x",
                f"{statistics.fmean(r['seconds']):.3f}",
            ]
        )
    headers = ["target/base MiB", "state uploaded at fill", "table files at end", "mean per batch"]
    headers += ["mean, last quarter", "median", "largest", f"mean vs {results[0]['shape']}", "s per checkpoint"]
    print()
    print(table(headers, rows))
    write_json(cfg.json, {"benchmark": "checkpoint_churn", "config": vars(cfg), "results": results})
    return {"results": results}


if __name__ == "__main__":
    main()
