"""``statehouse restore JOB --checkpoint N | --latest``: every replica replaces the job's state with its
own key groups of global checkpoint or savepoint N (written under any replica count). Stop the
job's writers first."""

from __future__ import annotations

import argparse

from statehouse.client.cli.common import CommandError, connection_options, emit, job_client, open_client, waiting
from statehouse.client.coordinator import CheckpointCoordinator

HELP = "restore a job on every replica from a global checkpoint or savepoint"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="the job's name")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", type=int, metavar="N", help="the checkpoint or savepoint id")
    which.add_argument(
        "--latest",
        action="store_true",
        help="the latest restorable global checkpoint or savepoint, of this layout or an earlier one "
        "(the one statehouse status names)",
    )
    connection_options(parser)


def run(args: argparse.Namespace) -> int:
    with open_client(args) as sh:
        coordinator = CheckpointCoordinator(job_client(sh, args.job, sh.topology()))
        checkpoint_id = args.checkpoint
        if args.latest:
            latest = coordinator.latest(every_layout=True)
            if latest is None:
                raise CommandError(f"job {args.job!r} has no global checkpoint: take one with statehouse savepoint")
            checkpoint_id = latest.checkpoint_id
        restored = waiting(args, f"restore of job {args.job}", lambda: coordinator.restore(checkpoint_id))
    replicas = [
        {"key_group_range": r["key_group_range"], "entries_restored": r["entries_restored"], "parts": r["parts"]}
        for r in restored
    ]
    document = {"job": args.job, "checkpoint_id": checkpoint_id, "replicas": replicas}
    lines = [f"job {args.job} restored from {restored[0]['kind']} {checkpoint_id} on {len(replicas)} replicas"]
    lines += [
        f"  replica {i}: key groups {r['key_group_range'][0]}-{r['key_group_range'][1]}, "
        f"{r['entries_restored']} entries"
        for i, r in enumerate(replicas)
    ]
    emit(args, document, lines)
    return 0
