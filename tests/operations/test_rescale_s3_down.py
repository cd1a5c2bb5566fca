"""Checkpoint storage (S3) unavailable during a live rescale: a failure anywhere in the move
(S3 unavailable included) leaves either the old layout serving or the new one, decided by one durable
record, and the operation can be resumed or rolled back by the CLI.

Real SeaweedFS, killed and started again on the same port and data directory (tests/support/s3server.py),
around three points of a 2 -> 3 move while plain writers append unique ids through the one-key, batch
and columnar doors (tests/support/writers.py): S3 down before the move's checkpoint, during the loads, and at
the decision. Each time the replicas keep the old layout serving (the moving key groups frozen: their
writes answer 503 and wait; the others are served) until the storage is back and the operator's
``statehouse rescale --abort`` or ``--resume`` ends the move; afterwards every acknowledged write is
present exactly once and every key is stored only on its owner.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from statehouse.client import StatehouseClient
from statehouse.client.rescale import LiveRescale, RescaleLeftPending
from statehouse.protocol.keygroups import assign_to_key_group
from tests.support.cli import cli
from tests.support.replica_set import misplaced
from tests.support.rescale_s3 import JOB, KEYS, STATE, P, ended, start_set
from tests.support.writers import Writers

pytestmark = [pytest.mark.http, pytest.mark.slow]  # 20-40 s each: three replica processes, S3 restarts

# The driver's bound on each wait while S3 stays down (it then leaves the move pending); the
# storage coming back is awaited by events, never by this.
SHORT_WAIT = 1.0


def key_in(start: int, end: int) -> str:
    """A key whose key group lies in [start, end]."""
    probes = (f"probe-{i}" for i in range(100_000))
    return next(k for k in probes if start <= assign_to_key_group(k, "string", P) <= end)


def add(url: str, key: str, value: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/jobs/{JOB}/states/{STATE}/keys/{key}/add", json={"value": value}, timeout=30)


def old_layout_serves_around_the_frozen_key_groups(seeds: list[str], phase: str) -> None:
    """The move is pending at ``phase`` on both old replicas; replica 0's moving-out key groups
    (43..63 of 0..63, 2 -> 3 replicas) refuse writes with a retryable 503 naming the target version and
    still answer reads; its staying ones (0..42) take writes and reads."""
    for url in seeds:
        move = httpx.get(f"{url}/v1/topology", timeout=30).json()["move"]
        assert (move["version"], move["phase"], move["joining"]) == (2, phase, False)
    moving, staying = key_in(43, 63), key_in(0, 42)
    refused = add(seeds[0], moving, "refused")
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
    assert (refused.json()["code"], refused.json()["topology_version"]) == ("rescale_in_progress", 2)
    read = httpx.get(f"{seeds[0]}/v1/jobs/{JOB}/states/{STATE}/keys/{moving}", timeout=30)
    assert read.status_code in (200, 404), read.text  # served (404: no value yet), not refused
    assert add(seeds[0], staying, "taken").status_code == 204
    got = httpx.get(f"{seeds[0]}/v1/jobs/{JOB}/states/{STATE}/keys/{staying}", timeout=30)
    assert got.status_code == 200 and "taken" in got.json()["value"], got.text


def decision(url: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/topology/decision", params={"version": 2}, timeout=60)


@pytest.mark.parametrize(("backend", "end"), [("heap", "--abort"), ("rocksdb", "--resume")])
def test_s3_down_before_the_checkpoint(tmp_path, s3, s3_location, backend, end):
    """The move's checkpoint fails (clearly), the driver cannot abort (the decision cannot be written):
    the move stays prepared, frozen, the old layout serving; the CLI ends it once S3 is back."""
    replicas, seeds, new = start_set(tmp_path, s3, s3_location, backend)
    try:
        with Writers(seeds, [*seeds, new], JOB, STATE, KEYS) as writers:
            writers.progress()

            def progress(step: str, _info: dict[str, Any]) -> None:
                if step == "prepared":
                    s3.kill()

            with (
                StatehouseClient(seeds) as client,
                LiveRescale(client, 3, [new], wait=SHORT_WAIT, progress=progress) as move,
                pytest.raises(RescaleLeftPending) as left,
            ):
                move.run()
            assert "could not be aborted after checkpoint" in left.value.detail, left.value.detail
            assert "statehouse rescale --abort" in left.value.detail
            old_layout_serves_around_the_frozen_key_groups(seeds, "prepared")

            s3.start()
            done = cli("rescale", end, urls=seeds)
            serving = ended(seeds, new, "aborted" if end == "--abort" else "committed")
            assert ("aborted" if end == "--abort" else "rescaled 2 -> 3") in done.stdout, done.stdout
            writers.progress()
        writers.check(serving)
        assert misplaced(serving, JOB, [STATE], P, count=len(serving)) == {STATE: []}
    finally:
        replicas.stop()


def test_s3_down_during_the_load(tmp_path, s3, s3_location):
    """Every load fails while S3 is down with a clear 503 storage_unavailable (a joining replica's
    too, asked directly: again the same answer, nothing half-loaded served); the driver waits for the
    storage, the load is retried once it is back and the move commits."""
    replicas, seeds, new = start_set(tmp_path, s3, s3_location, "rocksdb")
    moved: dict[str, int] = {}
    problems: list[dict[str, Any]] = []
    waited: list[dict[str, Any]] = []
    once = threading.Lock()

    def progress(step: str, info: dict[str, Any]) -> None:
        if step == "checkpointed":
            moved.update(info["checkpoints"])
            s3.kill()
        elif step == "waiting" and info["step"] == "load" and once.acquire(blocking=False):
            waited.append(info)
            for _again in range(2):  # the load is idempotent: the same clear answer each time
                answer = httpx.post(f"{new}/v1/topology/load", json={"version": 2, "checkpoints": moved}, timeout=60)
                assert answer.status_code == 503, answer.text
                problems.append(answer.json())
            s3.start()

    try:
        with Writers(seeds, [*seeds, new], JOB, STATE, KEYS) as writers:
            writers.progress()
            with (
                StatehouseClient(seeds) as client,
                LiveRescale(client, 3, [new], wait=120, progress=progress) as move,
            ):
                report = move.run()
            writers.progress()
        assert report.outcome == "committed" and report.copied[new]["entries"] > 0
        assert waited[0]["for"] == "storage_unavailable" and "S3" in waited[0]["detail"], waited
        assert [p["code"] for p in problems] == ["storage_unavailable"] * 2, problems
        assert all("checkpoint storage (S3)" in p["detail"] for p in problems), problems
        serving = ended(seeds, new, "committed")
        writers.check(serving)
        assert misplaced(serving, JOB, [STATE], P, count=3) == {STATE: []}
    finally:
        replicas.stop()


def test_s3_down_at_the_decision(tmp_path, s3, s3_location):
    """Every replica loaded, then S3 goes: nothing can be decided, the driver says the move stays
    pending; `statehouse rescale --abort` while S3 is still down is one clear line (exit 4), and once
    S3 is back it aborts: nothing was decided meanwhile, the old layout serves, the new replica
    holds nothing."""
    replicas, seeds, new = start_set(tmp_path, s3, s3_location, "heap")

    def progress(step: str, _info: dict[str, Any]) -> None:
        if step == "loaded":
            s3.kill()

    try:
        with Writers(seeds, [*seeds, new], JOB, STATE, KEYS) as writers:
            writers.progress()
            with (
                StatehouseClient(seeds) as client,
                LiveRescale(client, 3, [new], wait=SHORT_WAIT, progress=progress) as move,
                pytest.raises(RescaleLeftPending, match="could not be decided") as left,
            ):
                move.run()
            assert "statehouse rescale --resume" in left.value.detail
            old_layout_serves_around_the_frozen_key_groups(seeds, "loaded")
            unknown = decision(seeds[0])
            assert unknown.status_code == 503 and unknown.json()["code"] == "storage_unavailable", unknown.text

            refused = cli("rescale", "--abort", "--wait", str(SHORT_WAIT), urls=seeds, code=4)
            [line] = refused.stderr.strip().splitlines()[-1:]
            assert line.startswith("statehouse rescale: the rescale to 3 replicas (topology version 2) could not be")
            assert "Traceback" not in refused.stderr and "S3" in line, refused.stderr
            unread = cli("rescale", "--resume", urls=seeds, code=4)  # where the move stands needs its decision
            assert unread.stderr.startswith("statehouse rescale: checkpoint storage (S3) failed to read"), unread.stderr
            assert unread.stderr.strip().endswith("run the command again once checkpoint storage answers")

            s3.start()
            assert decision(seeds[0]).status_code == 404  # undecided: nothing was written while S3 was down
            assert "aborted" in cli("rescale", "--abort", urls=seeds).stdout
            serving = ended(seeds, new, "aborted")
            writers.progress()
        writers.check(serving)
        assert misplaced(seeds, JOB, [STATE], P, count=2) == {STATE: []}  # the new replica has no job (above)
    finally:
        replicas.stop()
