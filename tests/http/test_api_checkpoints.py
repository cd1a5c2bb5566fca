"""Checkpoint, savepoint and restore endpoints over real HTTP; a SIGKILLed process loses
nothing that was reported checkpointed."""

import signal

import httpx
import pytest

from tests.support.checkpoint_status import wait_status
from tests.support.server import start_server

pytestmark = [pytest.mark.http]


@pytest.fixture
def job(http, job_name):
    http.put(f"/jobs/{job_name}", json={"max_parallelism": 128})
    http.put(f"/jobs/{job_name}/states/total", json={"kind": "reducing", "function": "sum"})
    http.put(f"/jobs/{job_name}/states/seen", json={"kind": "map"})
    return f"/jobs/{job_name}"


def add(http, job, key, amount):
    ops = [
        {"op": "add", "state": "total", "key": key, "value": amount},
        {"op": "map_put", "state": "seen", "key": key, "user_key": str(amount), "value": True},
    ]
    assert http.post(f"{job}/batch", json={"ops": ops}).status_code == 200


def total(http, job, key):
    return http.get(f"{job}/states/total/keys/{key}").json().get("value")


def test_checkpoint_lifecycle(http, job):
    add(http, job, "a", 1)
    r = http.post(f"{job}/checkpoints", json={"checkpoint_id": 1, "metadata": {"batch_id": 4}})
    assert r.status_code == 202 and r.json()["status"] == "in_progress"
    assert r.json()["metadata"] == {"batch_id": 4}
    assert wait_status(http, job, 1)["status"] in ("uploaded", "completed")
    done = http.post(f"{job}/checkpoints/1/complete").json()
    assert done["status"] == "completed" and done["bytes_uploaded"] > 0
    assert done["metadata"] == {"batch_id": 4}
    conflict = http.post(f"{job}/checkpoints", json={"checkpoint_id": 1})
    assert conflict.status_code == 409 and conflict.json()["code"] == "checkpoint_conflict"
    assert http.post(f"{job}/checkpoints", json={"checkpoint_id": 2}).status_code == 202
    aborted = http.post(f"{job}/checkpoints/2/abort").json()
    assert aborted["status"] == "aborted"
    assert http.post(f"{job}/checkpoints/2/complete").status_code == 409
    assert http.get(f"{job}/checkpoints/99").status_code == 404
    listed = http.get(f"{job}/checkpoints").json()["items"]
    assert [(c["checkpoint_id"], c["status"]) for c in listed] == [(1, "completed"), (2, "aborted")]


def test_a_long_poll_answers_when_the_upload_has_ended(http, job):
    add(http, job, "a", 1)
    assert http.post(f"{job}/checkpoints", json={"checkpoint_id": 1}).status_code == 202
    # One request, no polling: it answers once the upload has ended (well within 10 s).
    waited = http.get(f"{job}/checkpoints/1", params={"wait_ms": 10_000})
    assert waited.status_code == 200 and waited.json()["status"] == "uploaded"
    assert http.post(f"{job}/checkpoints/1/complete").json()["status"] == "completed"
    done = http.get(f"{job}/checkpoints/1", params={"wait_ms": 10_000})  # nothing to wait for
    assert done.json()["status"] == "completed"
    for bad in ("10001", "-1", "07", "1.5", "x"):
        refused = http.get(f"{job}/checkpoints/1", params={"wait_ms": bad})
        assert refused.status_code == 422, (bad, refused.text)
    missing = http.get(f"{job}/checkpoints/9", params={"wait_ms": 1_000})
    assert missing.status_code == 404 and missing.json()["code"] == "checkpoint_not_found"


def test_a_trigger_waits_for_its_upload_and_with_one_replica_completes_it(http, job):
    """The coordinator's round trips folded: `wait_ms` answers once the upload has ended (200
    `uploaded`; nothing completed yet), `complete` completes the part in the same request (one
    replica: it is the whole checkpoint); a bad wait or flag is a 422, nothing triggered."""
    add(http, job, "a", 1)
    waited = http.post(f"{job}/checkpoints", json={"checkpoint_id": 1, "wait_ms": 10_000})
    assert waited.status_code == 200 and waited.json()["status"] == "uploaded"
    assert http.post(f"{job}/checkpoints/1/complete").json()["status"] == "completed"
    add(http, job, "a", 2)
    done = http.post(f"{job}/checkpoints", json={"metadata": {"batch_id": 7}, "complete": True})
    assert done.status_code == 200, done.text
    info = done.json()
    assert (info["checkpoint_id"], info["status"], info["metadata"]) == (2, "completed", {"batch_id": 7})
    listed = http.get(f"{job}/checkpoints").json()
    assert [(c["checkpoint_id"], c["status"]) for c in listed["items"]] == [(1, "completed"), (2, "completed")]
    for bad in ({"wait_ms": 10_001}, {"wait_ms": -1}, {"wait_ms": "5"}, {"complete": "yes"}, {"complete": 1}):
        refused = http.post(f"{job}/checkpoints", json=bad)
        assert refused.status_code == 422 and refused.json()["code"] == "validation_error", (bad, refused.text)
    assert http.get(f"{job}/checkpoints").json()["next_checkpoint_id"] == 3  # nothing was triggered
    http.post(f"{job}/restore", json={"checkpoint_id": 2}).raise_for_status()
    assert total(http, job, "a") == 3


def test_a_replica_of_several_refuses_to_complete_its_part_alone(two_replicas, job_name):
    """No part may complete before every part is uploaded (it would subsume the checkpoint before):
    with several replicas, `complete` on the trigger is a 422 saying so, and nothing is triggered."""
    with httpx.Client(base_url=two_replicas[0].url + "/v1", timeout=10) as http:
        http.put(f"/jobs/{job_name}", json={"max_parallelism": 128}).raise_for_status()
        refused = http.post(f"/jobs/{job_name}/checkpoints", json={"complete": True})
        assert refused.status_code == 422 and refused.json()["code"] == "invalid_argument"
        assert "every part is uploaded" in refused.json()["detail"]
        assert http.get(f"/jobs/{job_name}/checkpoints").json()["items"] == []


def test_restore_aborts_pending_checkpoints_and_says_so(http, job):
    """A pending checkpoint froze the state that a restore replaces: completing it afterwards
    would record state that no longer exists, so the restore aborts it and reports it."""
    add(http, job, "a", 1)
    http.post(f"{job}/checkpoints", json={"checkpoint_id": 1})
    wait_status(http, job, 1)
    http.post(f"{job}/checkpoints/1/complete").raise_for_status()
    add(http, job, "a", 10)
    http.post(f"{job}/checkpoints", json={"checkpoint_id": 2})
    assert wait_status(http, job, 2)["status"] == "uploaded"  # durable, waiting for complete
    restored = http.post(f"{job}/restore", json={"checkpoint_id": 1}).json()
    assert restored["aborted_checkpoints"] == [2] and total(http, job, "a") == 1
    assert http.get(f"{job}/checkpoints/2").json()["status"] == "aborted"
    refused = http.post(f"{job}/checkpoints/2/complete")
    assert refused.status_code == 409 and refused.json()["code"] == "checkpoint_failed"
    again = http.post(f"{job}/restore", json={"checkpoint_id": 1}).json()
    assert again["aborted_checkpoints"] == []
    bad = http.post(f"{job}/checkpoints", json={"kind": "backup"})
    assert bad.status_code == 422


def test_writes_after_the_trigger_are_not_in_the_checkpoint(http, job):
    for i in range(50):
        add(http, job, f"k{i}", 1)
    assert http.post(f"{job}/checkpoints", json={"checkpoint_id": 1}).status_code == 202
    for i in range(50):  # not blocked by the upload
        add(http, job, f"k{i}", 10)
    assert total(http, job, "k7") == 11
    wait_status(http, job, 1)
    assert http.post(f"{job}/checkpoints/1/complete").json()["status"] == "completed"
    restored = http.post(f"{job}/restore", json={"checkpoint_id": 1})
    assert restored.status_code == 200, restored.text
    assert [total(http, job, f"k{i}") for i in range(50)] == [1] * 50


def test_savepoint_and_restore_errors(http, job):
    add(http, job, "a", 1)
    assert http.post(f"{job}/checkpoints", json={"checkpoint_id": 7, "kind": "savepoint"}).status_code == 202
    wait_status(http, job, 7)
    savepoint = http.post(f"{job}/checkpoints/7/complete").json()
    assert savepoint["kind"] == "savepoint" and savepoint["format"] == "full"
    add(http, job, "a", 5)
    assert http.post(f"{job}/restore", json={"location": savepoint["location"]}).status_code == 200
    assert total(http, job, "a") == 1
    missing = http.post(f"{job}/restore", json={"checkpoint_id": 999})
    assert missing.status_code == 404 and missing.json()["code"] == "checkpoint_not_found"
    both = http.post(f"{job}/restore", json={"checkpoint_id": 7, "location": savepoint["location"]})
    assert both.status_code == 422
    for outside in ("/etc", savepoint["location"] + "/../../../..", "file:///tmp", "memory://x/y", "/tmp/a\x00b"):
        escaped = http.post(f"{job}/restore", json={"location": outside})
        assert escaped.status_code == 400 and escaped.json()["code"] == "invalid_location"
    assert total(http, job, "a") == 1


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "storage"), [("rocksdb", "local"), ("heap", "local"), ("rocksdb", "s3")])
def test_sigkill_after_a_completed_checkpoint_loses_nothing_checkpointed(request, tmp_path, backend, storage):
    env = {"STATEHOUSE_BACKEND": backend, "STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    if storage == "s3":  # real S3 (SeaweedFS); credentials the standard AWS way, from the environment
        env["STATEHOUSE_CHECKPOINT_DIR"] = request.getfixturevalue("s3_location")
        env["STATEHOUSE_S3_ENDPOINT_URL"] = request.getfixturevalue("s3_server").endpoint
    first = start_server(tmp_path / "first", env)
    try:
        http = httpx.Client(base_url=first.url + "/v1", timeout=10)
        http.put("/jobs/j", json={"max_parallelism": 128})
        http.put("/jobs/j/states/total", json={"kind": "reducing", "function": "sum"})
        http.put("/jobs/j/states/seen", json={"kind": "map"})
        expected = {}
        for i in range(200):
            add(http, "/jobs/j", f"user-{i}", i)
            expected[f"user-{i}"] = i
        # Then a few users change before each later checkpoint: the heap's are deltas over the first.
        for checkpoint_id in (1, 2, 3):
            if checkpoint_id > 1:
                for i in range(checkpoint_id, 200, 37):
                    add(http, "/jobs/j", f"user-{i}", 10)
                    expected[f"user-{i}"] += 10
            http.post("/jobs/j/checkpoints", json={"checkpoint_id": checkpoint_id, "metadata": {"n": 200}})
            wait_status(http, "/jobs/j", checkpoint_id)
            assert http.post(f"/jobs/j/checkpoints/{checkpoint_id}/complete").json()["status"] == "completed"
        assert (
            http.get("/jobs/j/checkpoints/3").json()["format"]
            == {"rocksdb": "incremental", "heap": "changelog"}[backend]
        )
        add(http, "/jobs/j", "user-1", 1000)  # after the checkpoint: may be lost
    finally:
        first.stop(signal.SIGKILL)
    # A fresh process on a fresh machine (empty data dir), same checkpoint storage.
    second = start_server(tmp_path / "second", env)
    try:
        http = httpx.Client(base_url=second.url + "/v1", timeout=10)
        assert http.get("/jobs/j").status_code == 404
        assert http.post("/jobs/j/restore", json={"checkpoint_id": 3}).status_code == 200
        assert {f"user-{i}": total(http, "/jobs/j", f"user-{i}") for i in range(200)} == expected
        assert http.get("/jobs/j/states/seen/keys/user-5").json() == {"value": {"5": True}}
        assert http.get("/jobs/j/states/seen/keys/user-3").json() == {"value": {"3": True, "10": True}}
        assert http.get("/jobs/j").json()["states"] == ["seen", "total"]
        # the new process finds the checkpoint, and the metadata it was triggered with, in storage
        listed = http.get("/jobs/j/checkpoints").json()["items"]
        assert (listed[-1]["checkpoint_id"], listed[-1]["status"], listed[-1]["metadata"]) == (
            3,
            "completed",
            {"n": 200},
        )
    finally:
        second.stop()


def test_restore_advances_the_writer_epoch(http, job):
    """A checkpoint taken at epoch 0, restored after fencing epoch 7: the restore moves the
    epoch past 7, so writers of epoch 7 (their state was replaced) and zombies of 6 are fenced."""
    add(http, job, "a", 1)
    http.post(f"{job}/checkpoints", json={"checkpoint_id": 1})
    wait_status(http, job, 1)
    http.post(f"{job}/checkpoints/1/complete").raise_for_status()
    assert http.post(f"{job}/fence", json={"epoch": 7}).json()["epoch"] == 7
    http.post(f"{job}/restore", json={"checkpoint_id": 1}).raise_for_status()
    assert http.get(job).json()["epoch"] == 8
    for epoch in (6, 7):
        zombie = http.post(
            f"{job}/batch", json={"epoch": epoch, "ops": [{"op": "add", "state": "total", "key": "a", "value": 1}]}
        )
        assert zombie.status_code == 409 and zombie.json()["code"] == "stale_epoch"
    assert total(http, job, "a") == 1
