"""``statehouse savepoint JOB``: one savepoint id on every replica, wait for every upload, complete it
everywhere (aborted everywhere if one part fails): client/coordinator.py's CheckpointCoordinator."""

from __future__ import annotations

import argparse

from statehouse.client.cli.common import connection_options, emit, job_client, open_client, waiting
from statehouse.client.coordinator import CheckpointCoordinator

HELP = "take a savepoint of a job on every replica"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="the job's name")
    parser.add_argument("--id", type=int, help="the savepoint id (default: above every id any replica has seen)")
    parser.add_argument("--wait", type=float, default=300.0, help="seconds to wait for the uploads (default 300)")
    connection_options(parser)


def run(args: argparse.Namespace) -> int:
    with open_client(args) as sh:
        coordinator = CheckpointCoordinator(job_client(sh, args.job, sh.topology()), timeout=args.wait)
        taken = waiting(args, f"savepoint of job {args.job}", lambda: coordinator.savepoint(args.id))
    locations = [part.get("location") for part in taken.parts]
    document = {
        "job": args.job,
        "checkpoint_id": taken.checkpoint_id,
        "kind": taken.kind,
        "bytes_uploaded": taken.bytes_uploaded,
        "locations": locations,
    }
    # Replicas sharing a checkpoint storage write their parts into one directory: shown once.
    lines = [f"savepoint {taken.checkpoint_id} of job {args.job}: completed on {len(locations)} replicas"]
    lines += [f"  {location}" for location in dict.fromkeys(locations)]
    emit(args, document, lines)
    return 0
