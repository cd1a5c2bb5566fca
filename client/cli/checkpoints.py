"""``statehouse checkpoints JOB``: the job's global checkpoints and savepoints (complete on every
replica), oldest first, with their metadata (a micro-batch's id and epoch, a rescale's plan): what a
restore can take. Those an earlier layout wrote (before a rescale; the replicas remove them once the new
layout retained its own) are listed too, with the replica count that wrote them. The last one listed is
the latest global checkpoint ``statehouse status`` shows."""

from __future__ import annotations

import argparse
import json

from statehouse.client.cli.common import connection_options, emit, job_client, open_client
from statehouse.client.coordinator import CheckpointCoordinator

HELP = "a job's global checkpoints and savepoints"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="the job's name")
    connection_options(parser)


def run(args: argparse.Namespace) -> int:
    with open_client(args) as sh:
        coordinator = CheckpointCoordinator(job_client(sh, args.job, sh.topology()))
        done = coordinator.completed(every_layout=True)
    items = [
        {
            "checkpoint_id": c.checkpoint_id,
            "kind": c.kind,
            "replica_count": c.parts[0].get("replica_count"),
            "bytes_uploaded": c.bytes_uploaded,
            "metadata": c.metadata,
            "locations": [part.get("location") for part in c.parts],
        }
        for c in done
    ]
    lines = [f"job {args.job}: {len(items)} global checkpoints" if items else f"job {args.job}: no global checkpoint"]
    lines += [
        f"  {i['checkpoint_id']:>6} {i['kind']:<10} {i['bytes_uploaded']:>12} bytes  {i['replica_count']} replicas  "
        f"{json.dumps(i['metadata'], sort_keys=True) if i['metadata'] else ''}"
        for i in items
    ]
    emit(args, {"job": args.job, "checkpoints": items}, lines)
    return 0
