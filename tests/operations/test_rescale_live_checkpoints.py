"""Checkpoints of the layout before a live rescale. As in Flink, where the rescaled job's own
retained checkpoints supersede the ones it was restored from: the old layout's checkpoints (the move's
own among them) stay in storage and restorable — `statehouse checkpoints` lists them, marked with the
replica count that wrote them — until the new layout has retained its own (``num_retained``, counted
together with them, newest first); then replica 0 of the new layout removes their parts, metadata and
shared files. Local directory and S3 (SeaweedFS), RocksDB (incremental checkpoints: shared files)."""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from statehouse.client import StatehouseClient
from statehouse.client.coordinator import CheckpointCoordinator
from statehouse.client.global_checkpoints import GlobalCheckpoint
from statehouse.client.rescale import LiveRescale
from statehouse.snapshots.catalog import read_metadata
from statehouse.snapshots.layout import metadata_name, snapshot_dir
from statehouse.snapshots.metadata import SnapshotMetadata
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


def part_metadata(storage: dict[str, str], checkpoint_id: int, count: int) -> list[SnapshotMetadata]:
    files = open_storage(storage["STATEHOUSE_CHECKPOINT_DIR"])
    directory = snapshot_dir(JOB, checkpoint_id, "checkpoint")
    return [read_metadata(files, directory, metadata_name(i, count)) for i in range(count)]


def shared_files(metadata: SnapshotMetadata) -> set[str]:
    """The shared files a part uses, relative to the job's directory (as :func:`stored` lists them)."""
    directory = snapshot_dir(JOB, metadata.checkpoint_id, "checkpoint")
    return {h.under(directory).path[len(JOB) + 1 :] for h in metadata.shared_handles().values()}


def missing(storage: dict[str, str], checkpoints: dict[int, int]) -> set[str]:
    """The files that the parts of ``checkpoints`` (id -> replica count) name and storage lacks."""
    named = set()
    for checkpoint_id, count in checkpoints.items():
        for metadata in part_metadata(storage, checkpoint_id, count):
            named |= {f"chk-{checkpoint_id}/{path}" for path in metadata.part_files()} | shared_files(metadata)
    return named - set(stored(storage))


def unreferenced(storage: dict[str, str], checkpoints: dict[int, int]) -> set[str]:
    """The shared files in storage that no part of ``checkpoints`` (id -> replica count) uses."""
    used = set().union(*(shared_files(m) for i, n in checkpoints.items() for m in part_metadata(storage, i, n)))
    return {f for f in stored(storage) if f.startswith("shared/")} - used


def listed(urls: list[str]) -> dict[int, int]:
    """`statehouse checkpoints JOB`: checkpoint id -> the replica count that wrote it."""
    shown = cli_json("checkpoints", JOB, urls=urls)["checkpoints"]
    return {c["checkpoint_id"]: c["replica_count"] for c in shown}


def read_back(client: StatehouseClient, keys: Iterable[str]) -> dict[str, object]:
    """The job's value of each key."""
    with client.job(JOB).batch() as reads:
        pending = {key: reads.get("v", key) for key in keys}
    return {key: p.value for key, p in pending.items()}


def start_with_a_job(replicas: ReplicaSet, values: dict[str, object]) -> tuple[list[str], str]:
    """Replicas 0 and 1 of 2 holding the job's state ``v`` with ``values``, and an empty replica 2 of 3
    at version 2: the old layout's URLs and the joining replica's."""
    urls = replicas.start(2)
    new = replicas.add(2, 3, version=2).url
    with StatehouseClient(urls) as client:
        job = client.create_job(JOB, P)
        job.register("v", "value")
        with job.batch() as batch:
            for key, value in values.items():
                batch.put("v", key, value)
    return urls, new


def checkpointed_then_grown(
    replicas: ReplicaSet, values: dict[str, object], precopy: bool
) -> tuple[list[str], GlobalCheckpoint, int]:
    """:func:`start_with_a_job`, a checkpoint, then a move 2 -> 3: the old layout's URLs, that
    checkpoint and the move's."""
    urls, new = start_with_a_job(replicas, values)
    with StatehouseClient(urls) as client:
        before = CheckpointCoordinator(client.job(JOB)).checkpoint()
        with LiveRescale(client, 3, [new], wait=120, precopy=precopy) as move:
            return urls, before, move.run().checkpoints[JOB]


def test_old_layout_checkpoints_stay_restorable_until_the_new_layout_retains_its_own(tmp_path, storage):
    replicas = ReplicaSet(tmp_path / "replicas", {**storage, "STATEHOUSE_NUM_RETAINED": str(RETAINED)})
    try:
        urls, new = start_with_a_job(replicas, {key: i for i, key in enumerate(KEYS)})
        with StatehouseClient(urls) as client:
            before = CheckpointCoordinator(client.job(JOB)).checkpoint().checkpoint_id
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
            assert listed(urls) == {moved: 2, first: 3}  # listed once retention's deletes are done
            assert checkpoint_ids(stored(storage), 2) == {moved}
            later = [coordinator.checkpoint().checkpoint_id for _ in range(RETAINED - 1)]

        assert listed(urls) == dict.fromkeys([first, *later], 3)
        files = stored(storage)
        assert checkpoint_ids(files, 2) == set() and [f for f in files if "-of-2" in f] == []
        assert checkpoint_ids(files, 3) == {first, *later}
        with StatehouseClient(urls) as client:  # what is listed restores
            CheckpointCoordinator(client.job(JOB)).restore(first)
            assert read_back(client, KEYS) == {key: i for i, key in enumerate(KEYS)}
    finally:
        replicas.stop()


@pytest.mark.parametrize("precopy", [False, True], ids=["cut-only", "precopy"])
def test_the_first_checkpoint_after_a_move_reuses_what_each_staying_replica_uploaded_before(tmp_path, precopy):
    """A replica that stays through a move holds the same database: its first checkpoint of the new
    layout reuses the table files its old-layout checkpoints uploaded (what the move did not rewrite)
    instead of uploading its whole share again. Those files stay while any retained checkpoint of
    either layout uses them: every checkpoint still listed restores, before and after the old layout's
    are retired, and nothing either layout no longer uses is left in storage."""
    checkpoints = tmp_path / "checkpoints"
    settings = {"STATEHOUSE_CHECKPOINT_DIR": str(checkpoints), "STATEHOUSE_NUM_RETAINED": str(RETAINED)}
    # The moving key groups compacted into files of their own before the move's checkpoint, whatever
    # the fill left in level 0 (one flush: a file spanning every key group, which the drop after the
    # commit would rewrite whole): what compactions have made of a long-running job's files.
    settings["STATEHOUSE_RESCALE_COMPACT_MOVING"] = "true"
    replicas = ReplicaSet(tmp_path / "replicas", settings)
    # Incompressible values: table files far larger than the options file every checkpoint shares.
    rng = random.Random(44)
    values = {f"user-{i}": rng.randbytes(500).hex() for i in range(24_000)}
    try:
        urls, before, moved = checkpointed_then_grown(replicas, values, precopy)

        with StatehouseClient(urls) as client:
            coordinator = CheckpointCoordinator(client.job(JOB))
            first = coordinator.checkpoint()
            parts = {p["replica_index"]: p for p in first.parts}
            # Replica 0 only gives key groups away; replica 1 gives some and gains others, whose files
            # (new to it) go up unless the pre-copy's checkpoints of the old layout carried them.
            assert parts[0]["bytes_reused"] > 10 * parts[0]["bytes_uploaded"], parts[0]
            assert parts[1]["bytes_reused"] > 3_000_000, parts[1]  # of the ~4.6 MB it keeps
            if precopy:  # the joining replica uploaded what its copy loaded during the copy
                assert parts[2]["bytes_reused"] > 10 * parts[2]["bytes_uploaded"], parts[2]
                assert first.bytes_uploaded < 0.1 * before.bytes_uploaded
            else:  # its database is new, and nothing was uploaded ahead
                assert parts[2]["bytes_reused"] == 0
                assert first.bytes_uploaded < 0.6 * before.bytes_uploaded
            # Both layouts' checkpoints are whole in storage, and nothing else is there (once the
            # replicas' deletes are done: a listing waits for them).
            assert listed(urls) == {moved: 2, first.checkpoint_id: 3}
            assert missing(settings, {moved: 2, first.checkpoint_id: 3}) == set()
            assert unreferenced(settings, {moved: 2, first.checkpoint_id: 3}) == set()

            second = coordinator.checkpoint().checkpoint_id
            assert listed(urls) == {first.checkpoint_id: 3, second: 3}
            assert [f for f in stored(settings) if "-of-2" in f] == []  # the old layout's retired
            assert missing(settings, {first.checkpoint_id: 3, second: 3}) == set()
            assert unreferenced(settings, {first.checkpoint_id: 3, second: 3}) == set()
            coordinator.restore(first.checkpoint_id)  # the one whose files the old layout uploaded
            assert read_back(client, values) == values
    finally:
        replicas.stop()


@pytest.mark.parametrize("backend", ["rocksdb", "heap"])
def test_what_a_joining_replica_uploaded_ahead_goes_when_the_move_is_aborted(tmp_path, backend):
    """A joining replica uploads what its pre-copy load made, for its first checkpoint (RocksDB:
    its table files; the heap: every replica that takes key groups, a base of them); the move
    aborted instead (its coordinator died after the copy, the operator aborts), nothing of it
    stays, and the old layout's next checkpoint restores what was written."""
    settings = {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    replicas = ReplicaSet(tmp_path / "replicas", settings, backend=backend)

    def die(step: str, info: dict) -> None:
        if step == "copied":
            raise RuntimeError("the coordinator died")

    try:
        urls, new = start_with_a_job(replicas, {key: i for i, key in enumerate(KEYS)})
        with StatehouseClient(urls) as client:
            with LiveRescale(client, 3, [new], wait=120, progress=die) as move, pytest.raises(RuntimeError):
                move.run()
            seeded = [f for f in stored(settings) if f.startswith("shared/")]
            if backend == "heap":
                assert any(f.endswith("-heap-seed") for f in seeded), seeded
            with LiveRescale(client, 3, [new], wait=120) as move:
                assert move.abort().outcome == "aborted"
            checkpoints = {int(i): 2 for i in checkpoint_ids(stored(settings), 2)}
            assert unreferenced(settings, checkpoints) == set(), seeded
            coordinator = CheckpointCoordinator(client.job(JOB))
            after = coordinator.checkpoint().checkpoint_id
            coordinator.restore(after)
            assert read_back(client, KEYS) == {key: i for i, key in enumerate(KEYS)}
    finally:
        replicas.stop()


@pytest.mark.parametrize("precopy", [False, True], ids=["cut-only", "precopy"])
def test_a_heap_replicas_first_checkpoint_after_a_move_builds_on_its_chains(tmp_path, precopy):
    """A heap replica's checkpoints are a changelog: after a move, the key groups it held before
    keep their chain (its old base and deltas, in shared files of the old layout's checkpoints).
    Without a pre-copy, the key groups it took are written whole (a joining replica's: a base);
    with one, a base of them was written as the copy loaded them (a seed, while writes went on),
    and the checkpoint chains on it too. Grown 2 -> 3, then shrunk 3 -> 2: every checkpoint
    listed restores to what was written, while the old layout's are retired, and storage holds
    nothing no checkpoint uses."""
    settings = {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "STATEHOUSE_NUM_RETAINED": "2"}
    replicas = ReplicaSet(tmp_path / "replicas", settings, backend="heap")
    rng = random.Random(45)
    values = {f"user-{i}": rng.randbytes(200).hex() for i in range(6_000)}
    try:
        _urls, before, grown = checkpointed_then_grown(replicas, values, precopy)
        urls = replicas.urls

        def changed(client: StatehouseClient, step: str) -> None:  # a few keys each time: deltas
            with client.job(JOB).batch() as batch:
                for key in list(values)[:: len(values) // 20]:
                    values[key] = f"{step}-{key}"
                    batch.put("v", key, values[key])

        def restores(coordinator: CheckpointCoordinator, client: StatehouseClient, checkpoint_id: int) -> None:
            coordinator.restore(checkpoint_id)
            assert read_back(client, values) == values

        with StatehouseClient(urls) as client:
            coordinator = CheckpointCoordinator(client.job(JOB))
            changed(client, "after-grow")
            first, at_first = coordinator.checkpoint(), dict(values)
            parts = {p["replica_index"]: p for p in first.parts}
            # P=32: replica 0 held 0-15 and keeps 0-10; replica 1 held 16-31, keeps 16-21 and takes
            # 11-15; replica 2 takes 22-31 and held nothing.
            assert parts[0]["bytes_reused"] > 10 * parts[0]["bytes_uploaded"], parts[0]
            if precopy:  # what the others took was seeded during the copy
                for index in (1, 2):
                    assert parts[index]["bytes_reused"] > 5 * parts[index]["bytes_uploaded"], parts[index]
                assert first.bytes_uploaded < 0.1 * before.bytes_uploaded
            else:
                assert parts[1]["bytes_reused"] > parts[1]["bytes_uploaded"], parts[1]
                assert parts[2]["bytes_reused"] == 0, parts[2]
                assert first.bytes_uploaded < 0.6 * before.bytes_uploaded
            assert listed(urls) == {grown: 2, first.checkpoint_id: 3}  # once retention's deletes are done
            assert missing(settings, {grown: 2, first.checkpoint_id: 3}) == set()
            assert unreferenced(settings, {grown: 2, first.checkpoint_id: 3}) == set()
            changed(client, "later")
            second = coordinator.checkpoint().checkpoint_id
            assert listed(urls) == {first.checkpoint_id: 3, second: 3}
            assert [f for f in stored(settings) if "-of-2" in f] == []  # the old layout's retired
            assert missing(settings, {first.checkpoint_id: 3, second: 3}) == set()
            values.clear()
            values.update(at_first)
            restores(coordinator, client, first.checkpoint_id)  # its chains name old-layout files

            with LiveRescale(client, 2, [], wait=120, precopy=precopy) as move:
                shrunk = move.run().checkpoints[JOB]
        urls = replicas.urls[:2]
        with StatehouseClient(urls) as client:
            coordinator = CheckpointCoordinator(client.job(JOB))
            changed(client, "after-shrink")
            third = coordinator.checkpoint()
            # Replica 0 held 0-10 and takes 11-15; replica 1 held 11-21, keeps 16-21 and takes 22-31:
            # what they take is written whole, what they keep builds on their chains.
            parts = {p["replica_index"]: p for p in third.parts}
            if precopy:
                for part in parts.values():
                    assert part["bytes_reused"] > 5 * part["bytes_uploaded"], part
                assert third.bytes_uploaded < 0.1 * before.bytes_uploaded
            else:
                assert parts[0]["bytes_reused"] > parts[0]["bytes_uploaded"], parts[0]
                assert parts[1]["bytes_reused"] > 0.4 * parts[1]["bytes_uploaded"], parts[1]
                assert third.bytes_uploaded < 0.6 * before.bytes_uploaded
            assert listed(urls) == {shrunk: 3, third.checkpoint_id: 2}
            assert missing(settings, {shrunk: 3, third.checkpoint_id: 2}) == set()
            assert unreferenced(settings, {shrunk: 3, third.checkpoint_id: 2}) == set()
            restores(coordinator, client, third.checkpoint_id)
    finally:
        replicas.stop()
