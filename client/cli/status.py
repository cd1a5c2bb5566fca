"""``statehouse status``: the replica set, its topology version, every job's ranges, each job's
latest global checkpoint, and a live rescale pending on it. The latest global checkpoint is the
newest a restore can take: completed by every replica of this layout or of an earlier one (before a
rescale), the last that ``statehouse checkpoints`` lists."""

from __future__ import annotations

import argparse
import json
from typing import Any

from statehouse.client.cli.common import connection_options, emit, job_client, job_names, open_client
from statehouse.client.coordinator import CheckpointCoordinator
from statehouse.client.errors import StatehouseError
from statehouse.protocol import routes

HELP = "replicas, topology version, jobs, ranges, latest restorable global checkpoint"


def configure(parser: argparse.ArgumentParser) -> None:
    connection_options(parser)


def run(args: argparse.Namespace) -> int:
    with open_client(args) as sh:
        shown = sh.topology()
        first = shown[0]
        jobs = [_job(sh, name, shown) for name in job_names(shown)]
    replicas = [{"index": s["replica_index"], "url": sh.replicas[i].url} for i, s in enumerate(shown)]
    document = {
        "set_id": first["set_id"],
        "version": first["version"],
        "replica_count": first["replica_count"],
        "replicas": replicas,
        "jobs": jobs,
        "move": next((s["move"] for s in shown if s.get("move")), None),
    }
    lines = [
        f"replica set {first['set_id']}: {first['replica_count']} replicas, topology version {first['version']}",
        *(f"  replica {r['index']}: {r['url']}" for r in replicas),
        f"jobs: {len(jobs)}" if jobs else "jobs: none",
    ]
    move = document["move"]
    if move:
        lines.insert(
            1,
            f"  a live rescale to {move['replica_count']} replicas (topology version {move['version']}) is pending "
            f"({move['phase']}): it ends by itself, or finish it with statehouse rescale --resume (or --abort)",
        )
    for job in jobs:
        # A replica without the job (restored without it, or a create that stopped half way) shows as such.
        ranges = " ".join(f"{r[0]}-{r[1]}" if r else "missing" for r in job["key_group_ranges"])
        latest = job["latest_checkpoint"]
        checkpoint = f"{latest['kind']} {latest['checkpoint_id']}" if latest else job.get("checkpoint_error", "none")
        serving = "" if job["serving"] else f"  NOT SERVING ({_not_serving(job)})"
        lines.append(
            f"  {job['job']}: max_parallelism {job['max_parallelism']}, key groups {ranges}, "
            f"latest global checkpoint: {checkpoint}{serving}"
        )
    emit(args, document, lines)
    return 0


def _not_serving(job: dict[str, Any]) -> str:
    """What to do about a job that some replica does not serve."""
    lacking = [str(i) for i, r in enumerate(job["key_group_ranges"]) if r is None]
    if lacking:  # a create that stopped half way, or a replica restored without the job
        body = json.dumps({"max_parallelism": job["max_parallelism"]})
        create = f"PUT {routes.path(routes.JOB, job=job['job'])} {body}"
        return (
            f"missing on replica {', '.join(lacking)}: create it there, {create}, "
            f"or restore it from a checkpoint: statehouse restore {job['job']} --latest"
        )
    return f"its data is of another layout: restore it, statehouse restore {job['job']} --latest"


def _job(sh: Any, name: str, shown: list[dict[str, Any]]) -> dict[str, Any]:
    """One job across the replicas: its range on each (``None`` where a replica lacks it)."""
    records = [next((j for j in info["jobs"] if j["job"] == name), None) for info in shown]
    job: dict[str, Any] = {
        "job": name,
        "max_parallelism": next(r["max_parallelism"] for r in records if r is not None),
        "key_group_ranges": [r["key_group_range"] if r else None for r in records],
        "serving": all(r is not None and r["serving"] for r in records),
        "latest_checkpoint": None,
    }
    if job["serving"]:
        try:
            latest = CheckpointCoordinator(job_client(sh, name, shown)).latest(every_layout=True)
        except StatehouseError as exc:
            job["checkpoint_error"] = f"unknown ({exc})"
        else:
            if latest is not None:
                job["latest_checkpoint"] = {"checkpoint_id": latest.checkpoint_id, "kind": latest.kind}
    return job
