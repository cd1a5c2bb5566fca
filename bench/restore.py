"""Benchmark 5: restore and rescale from SeaweedFS S3.

A RocksDB replica (1 of 1) fills a job and completes an incremental checkpoint (id 1) and a
savepoint (id 2, the full format). Fresh replicas then restore it: replica 0 of 1 (the whole
range) and replica 0 of 2 (half the key groups, i.e. a rescale 1 -> 2). Reported: restore
time and bytes read from S3, against the snapshot's size.

    .venv/bin/python -m bench.restore --runs 3 --keys 1000000
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.common import Summary, print_header, s3_settings, statehouse, table, write_json
from bench.state import checkpoint, create_job, fill, mb

JOB = "restore"


def restore_once(env: dict[str, str], index: int, count: int, checkpoint_id: int) -> dict[str, Any]:
    settings = {**env, "STATEHOUSE_REPLICA_INDEX": str(index), "STATEHOUSE_REPLICA_COUNT": str(count)}
    with (
        statehouse("rocksdb", settings) as server,
        httpx.Client(base_url=server.url, timeout=1800) as http,
    ):
        response = http.post(f"/v1/jobs/{JOB}/restore", json={"checkpoint_id": checkpoint_id})
        response.raise_for_status()
        return response.json()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--s3-endpoint", help="use this SeaweedFS S3 (bucket 'snapshots') instead of starting one")
    p.add_argument("--json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header("Restore and rescale from S3 (SeaweedFS)")
    rows: list[list[Any]] = []
    results: list[dict] = []
    with contextlib.ExitStack() as stack:
        env = s3_settings(stack, cfg.s3_endpoint, "restore")
        workdir = Path(tempfile.mkdtemp(prefix="statehouse-bench-restore-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        with statehouse("rocksdb", env, workdir) as source, httpx.Client(base_url=source.url, timeout=1800) as http:
            create_job(http, JOB)
            fill(http, JOB, cfg.keys)
            incremental, _s = checkpoint(http, JOB, 1)
            savepoint, _s = checkpoint(http, JOB, 2, kind="savepoint")
        snapshots = {"incremental checkpoint": (1, incremental), "savepoint (full format)": (2, savepoint)}
        for name, (checkpoint_id, info) in snapshots.items():
            size = info["bytes_uploaded"] + info["bytes_reused"]
            for index, count, what in ((0, 1, "all key groups (1 of 1)"), (0, 2, "half (0 of 2, rescale 1->2)")):
                runs = [restore_once(env, index, count, checkpoint_id) for _ in range(cfg.runs)]
                seconds = Summary([r["duration_ms"] / 1000 for r in runs])
                read = Summary([r["bytes_read"] for r in runs])
                entries = runs[0]["entries_restored"]
                share = f"{read.median / size:.0%}"
                rows.append([name, what, mb(size), seconds.fmt(1, 2, " s"), mb(read.median), share, entries])
                results.append({"snapshot": name, "target": what, "snapshot_bytes": size, "runs": runs})
                print(f"  {name}, {what}: {seconds.fmt(1, 2, ' s')}, read {mb(read.median)} of {mb(size)}", flush=True)
    print()
    headers = ["snapshot", "restored range", "snapshot size", "restore time", "bytes read", "read/size", "entries"]
    print(table(headers, rows))
    write_json(cfg.json, {"benchmark": "restore", "keys": cfg.keys, "results": results})
    return {"results": results}


if __name__ == "__main__":
    main()
