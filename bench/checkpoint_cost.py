"""Benchmark 4: checkpoint cost as RocksDB state grows, on SeaweedFS S3.

For each state size (keys of 100 random bytes): the first incremental checkpoint (uploads
every SST), then 1% of the keys rewritten and a second incremental checkpoint, and a
savepoint (the full canonical format: the whole state scanned, encoded and uploaded). Bytes
uploaded and seconds from trigger to uploaded. Each size runs ``--runs`` times on a fresh job.

    .venv/bin/python -m bench.checkpoint_cost --runs 3 --sizes 300000,1000000,3000000
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.common import Summary, print_header, s3_settings, statehouse, table, write_json
from bench.state import checkpoint, create_job, dir_bytes, fill, mb, put_random


def measure(http: httpx.Client, workdir: Path, job: str, count: int, changed: float, seed: int) -> dict[str, Any]:
    create_job(http, job)
    key_list = fill(http, job, count)
    first, first_s = checkpoint(http, job, 1)
    changed_keys = random.Random(seed).sample(key_list, max(1, int(count * changed)))
    put_random(http, job, changed_keys)
    second, second_s = checkpoint(http, job, 2)
    savepoint, savepoint_s = checkpoint(http, job, 3, kind="savepoint")
    return {
        "keys": count,
        "state_bytes": dir_bytes(workdir / "data" / job),
        "full_bytes": first["bytes_uploaded"],
        "full_s": first_s,
        "incremental_bytes": second["bytes_uploaded"],
        "incremental_reused": second["bytes_reused"],
        "incremental_s": second_s,
        "savepoint_bytes": savepoint["bytes_uploaded"],
        "savepoint_s": savepoint_s,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[300_000, 1_000_000, 3_000_000])
    p.add_argument("--changed", type=float, default=0.01, help="fraction of keys rewritten between checkpoints")
    p.add_argument("--s3-endpoint", help="use this SeaweedFS S3 (bucket 'snapshots') instead of starting one")
    p.add_argument("--json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header("Checkpoint cost as RocksDB state grows (SeaweedFS S3)")
    rows: list[list[Any]] = []
    results: list[dict] = []
    with contextlib.ExitStack() as stack:
        env = s3_settings(stack, cfg.s3_endpoint, "cost")
        workdir = Path(tempfile.mkdtemp(prefix="statehouse-bench-cost-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        server = stack.enter_context(statehouse("rocksdb", env, workdir))
        http = stack.enter_context(httpx.Client(base_url=server.url, timeout=600))
        for count in cfg.sizes:
            runs = []
            for run in range(cfg.runs):
                job = f"cost{count}r{run}"
                r = measure(http, workdir, job, count, cfg.changed, seed=run)
                runs.append(r)
                print(
                    f"  {count:,} keys run {run + 1}: state {mb(r['state_bytes'])}; full {mb(r['full_bytes'])} "
                    f"in {r['full_s']:.1f}s; incremental {mb(r['incremental_bytes'])} in {r['incremental_s']:.1f}s "
                    f"({r['incremental_bytes'] / r['full_bytes']:.1%}); savepoint {mb(r['savepoint_bytes'])} "
                    f"in {r['savepoint_s']:.1f}s",
                    flush=True,
                )
                http.delete(f"/v1/jobs/{job}").raise_for_status()

            def s(field: str, runs=runs) -> Summary:
                return Summary([r[field] for r in runs])

            ratio = Summary([r["incremental_bytes"] / r["full_bytes"] for r in runs])
            rows.append(
                [
                    f"{count:,}",
                    mb(s("state_bytes").median),
                    mb(s("full_bytes").median),
                    s("full_s").fmt(1, 1, " s"),
                    mb(s("incremental_bytes").median),
                    s("incremental_s").fmt(1, 2, " s"),
                    ratio.fmt(100, 1, "%"),
                    mb(s("savepoint_bytes").median),
                    s("savepoint_s").fmt(1, 1, " s"),
                ]
            )
            results.append({"keys": count, "runs": runs})
    print()
    headers = ["keys", "state on disk", "full (1st incr.) bytes", "full time", "incremental bytes", "incr. time"]
    print(table([*headers, "incr./full", "savepoint bytes", "savepoint time"], rows))
    write_json(cfg.json, {"benchmark": "checkpoint_cost", "results": results})
    return {"results": results}


if __name__ == "__main__":
    main()
