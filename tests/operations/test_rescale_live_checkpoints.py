"""Checkpoints of the layout before a live rescale. As in Flink, where the rescaled job's own
retained checkpoints supersede the ones it was restored from: the old layout's checkpoints (the move's
own among them) stay in storage and restorable — `statehouse checkpoints` lists them, marked with the
replica count that wrote them — until the new layout has retained its own (``num_retained``, counted
together with them, newest first); then replica 0 of the new layout removes their parts, metadata and
shared files. Local directory and S3 (SeaweedFS), RocksDB (incremental checkpoints: shared files)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from statehouse.client import StatehouseClient
from statehouse.client.coordinator import CheckpointCoordinator
from statehouse.client.rescale import LiveRescale
from statehouse.snapshots.storage import open_storage
from tests.support.cli import cli_json
from tests.support.replica_set import ReplicaSet

pytestmark = [pytest.mark.http, pytest.mark.slow]  # 30-60 s each: three replica processes, a move

JOB, P = "kept", 32
KEYS = [f"user-{i}" for i in range(200)]
RETAINED = 2  # STATEHOUSE_NUM_RETAINED: completed checkpoints each replica keeps


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    if request.param == "local":
        yield {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
        return
    s3_server = request.getfixturevalue("s3_server")
    location = request.getfixturevalue("s3_location")
    yield {"STATEHOUSE_CHECKPOINT_DIR": location, "STATEHOUSE_S3_ENDPOINT_URL": s3_server.endpoint}


def stored(storage: dict[str, str]) -> list[str]:
    """Every file of the job in checkpoint storage, relative to the job's directory."""
    files = open_storage(
        storage["STATEHOUSE_CHECKPOINT_DIR"], s3_endpoint_url=storage.get("STATEHOUSE_S3_ENDPOINT_URL")
    )
    return sorted(path[len(JOB) + 1 :] for path in files.list(JOB))


def checkpoint_ids(files: list[str], count: int) -> set[int]:
    """Ids of the checkpoints with a part written under ``count`` replicas."""
    return {int(m[1]) for f in files if (m := re.match(rf"^chk-(\d+)/(?:_metadata\.)?replica-\d+-of-{count}\b", f))}


def listed(urls: list[str]) -> dict[int, int]:
    """`statehouse checkpoints JOB`: checkpoint id -> the replica count that wrote it."""
    shown = cli_json("checkpoints", JOB, urls=urls)["checkpoints"]
    return {c["checkpoint_id"]: c["replica_count"] for c in shown}


def test_old_layout_checkpoints_stay_restorable_until_the_new_layout_retains_its_own(tmp_path, storage):
    replicas = ReplicaSet(tmp_path / "replicas", {**storage, "STATEHOUSE_NUM_RETAINED": str(RETAINED)})
    try:
        urls = replicas.start(2)
        new = replicas.add(2, 3, version=2).url
        with StatehouseClient(urls) as client:
            job = client.create_job(JOB, P)
            job.register("v", "value")
            with job.batch() as batch:
                for i, key in enumerate(KEYS):
                    batch.put("v", key, i)
            before = CheckpointCoordinator(job).checkpoint().checkpoint_id
            # Without a pre-copy: the move takes one checkpoint, so the one before it is still retained
            with LiveRescale(client, 3, [new], wait=120, precopy=False) as move:
                moved = move.run().checkpoints[JOB]

        files = stored(storage)
        assert checkpoint_ids(files, 2) == {before, moved}
        assert listed(urls) == {before: 2, moved: 2}  # restorable, though no replica of 3 wrote them

        with StatehouseClient(urls) as client:
            job = client.job(JOB)
            coordinator = CheckpointCoordinator(job)
            first = coordinator.checkpoint().checkpoint_id
            # Counted with the new one, newest first: the move's checkpoint stays, the one before goes.
            assert checkpoint_ids(stored(storage), 2) == {moved}
            assert listed(urls) == {moved: 2, first: 3}
            later = [coordinator.checkpoint().checkpoint_id for _ in range(RETAINED - 1)]

        files = stored(storage)
        assert checkpoint_ids(files, 2) == set() and [f for f in files if "-of-2" in f] == []
        assert checkpoint_ids(files, 3) == {first, *later}
        assert listed(urls) == dict.fromkeys([first, *later], 3)
        with StatehouseClient(urls) as client:  # what is listed restores
            CheckpointCoordinator(client.job(JOB)).restore(first)
            with client.job(JOB).batch() as reads:
                values = {key: reads.get("v", key) for key in KEYS}
            assert {key: p.value for key, p in values.items()} == {key: i for i, key in enumerate(KEYS)}
    finally:
        replicas.stop()
