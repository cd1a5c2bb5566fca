"""A live rescale from 2 to 3 replicas over S3 checkpoint storage, for the tests that take S3 down
during it: the replica set with the job, and the layout serving once the move ended."""

from __future__ import annotations

from pathlib import Path

import httpx

from statehouse.client import StatehouseClient
from tests.support.replica_set import ReplicaSet
from tests.support.s3server import SeaweedS3

JOB, STATE, P = "s3down", "appended", 128

KEYS = [f"user-{i}" for i in range(120)]


def start_set(root: Path, s3: SeaweedS3, location: str, backend: str) -> tuple[ReplicaSet, list[str], str]:
    """Replicas 0 and 1 of 2 with the job, and a new, empty replica 2 of 3 at version 2; over S3."""
    storage = {"STATEHOUSE_CHECKPOINT_DIR": location, "STATEHOUSE_S3_ENDPOINT_URL": s3.endpoint}
    # One attempt per S3 request: with S3 down, a step fails at the first refused connection, not
    # after botocore's backoff (seconds at random); the waits for the storage are the driver's.
    replicas = ReplicaSet(root, storage, extra={"STATEHOUSE_S3_MAX_ATTEMPTS": "1"}, backend=backend)
    seeds = replicas.start(2)
    new = replicas.add(2, 3, version=2).url
    with StatehouseClient(seeds) as client:
        client.create_job(JOB, P).register(STATE, "list")
    return replicas, seeds, new


def ended(seeds: list[str], new: str, outcome: str) -> list[str]:
    """The layout serving once the move ended: the old two replicas (aborted; the new one holds
    nothing) or all three (committed); their URLs."""
    shown = [httpx.get(f"{url}/v1/topology", timeout=30).json() for url in [*seeds, new]]
    assert [s["move"] for s in shown] == [None, None, None]
    if outcome == "aborted":
        assert [(s["replica_count"], s["version"]) for s in shown[:2]] == [(2, 1), (2, 1)]
        assert (shown[2]["jobs"], shown[2]["unassigned"]) == ([], True)  # it was to join: it holds nothing
        return seeds
    assert [(s["replica_count"], s["version"]) for s in shown] == [(3, 2)] * 3
    return [*seeds, new]
