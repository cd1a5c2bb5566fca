"""A pre-copy's delta at the cut, on the engine alone: an old replica reads, inside the freeze, the
whole current content of every key its change tracker noted since the copy (``Job.changed``), then
packs it (``Delta.to_bytes``: msgpack and a sha256); a new one applies it (``apply_delta``).

One job of ``--keys`` keys of 100 bytes in a value state on ``--backend``, a tracker over every key
group, ``--changed`` random keys updated after it started. Each step's wall and CPU time (this
process's, every thread), the median of ``--runs``:

    .venv/bin/python -m bench.precopy_delta [--keys 300000] [--changed 50000] [--backend rocksdb] [--runs 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.common import print_header, table, write_json
from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing.precopy import Delta, apply_delta
from statehouse.backends.heap.store import HeapStore
from statehouse.backends.rocksdb.store import RocksDBStore
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.stored.descriptors import StateDescriptor

EVERY = KeyGroupRange(0, 127)


def timed(step: Callable[[], Any]) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = step()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def catalog(backend: str) -> JobCatalog:
    store = HeapStore() if backend == "heap" else RocksDBStore(tempfile.mkdtemp(prefix="statehouse-bench-delta-"))
    return JobCatalog(store, replica_index=0, replica_count=1)


def run(cfg: argparse.Namespace, seed: int) -> dict[str, float]:
    source, target = catalog(cfg.backend), catalog(cfg.backend)
    try:
        job, _ = source.create("j", 128)
        copy, _ = target.create("j", 128)
        job.register_state(StateDescriptor("v", "value"))
        keys = [f"k{i:015d}" for i in range(cfg.keys)]
        with job.transaction() as tx:
            for key in keys:
                tx.value("v").update(key, "x" * 100)
        job.track_changes([EVERY], "bench")
        with job.transaction() as tx:
            for key in random.Random(seed).sample(keys, cfg.changed):
                tx.value("v").update(key, "y" * 100)
        read_s, read_cpu, found = timed(lambda: job.changed("bench"))
        assert found is not None and len(found[2]) == cfg.changed
        delta = Delta("bench", [EVERY], *found[1:])
        pack_s, pack_cpu, data = timed(delta.to_bytes)
        apply_s, apply_cpu, applied = timed(lambda: apply_delta(copy, Delta.from_bytes(data), [EVERY]))
        assert applied == cfg.changed
        return {
            "read_s": read_s,
            "read_cpu_s": read_cpu,
            "pack_s": pack_s,
            "pack_cpu_s": pack_cpu,
            "apply_s": apply_s,
            "apply_cpu_s": apply_cpu,
            "bytes": len(data),
        }
    finally:
        source.close()
        target.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=300_000)
    p.add_argument("--changed", type=int, default=50_000)
    p.add_argument("--backend", default="rocksdb", choices=("rocksdb", "heap"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json")
    cfg = p.parse_args(argv)
    print_header("A pre-copy's delta: read at the cut, packed, applied")
    print(f"{cfg.keys:,} keys of 100 bytes, {cfg.changed:,} changed since the tracker started, {cfg.backend}")
    runs = [run(cfg, seed) for seed in range(cfg.runs)]
    median = {name: statistics.median(r[name] for r in runs) for name in runs[0]}
    rows = [
        [
            step,
            f"{median[f'{step}_s']:.3f}",
            f"{median[f'{step}_cpu_s']:.3f}",
            f"{median[f'{step}_s'] / cfg.changed * 1e6:.1f}",
        ]
        for step in ("read", "pack", "apply")
    ]
    print(table(["step", "wall s", "CPU s", "wall µs per key"], rows))
    print(f"delta: {median['bytes'] / 1e6:.1f} MB")
    result = {"config": vars(cfg), "runs": runs, "median": median}
    write_json(cfg.json, result)
    return result


if __name__ == "__main__":
    main()
