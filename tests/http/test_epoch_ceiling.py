"""A writer epoch fenced to its ceiling (2^63-1): no epoch can follow it, so `next` is refused with
a detail that says how to leave it, and that way works: delete the job and restore a snapshot
taken before the fence (it holds the epoch it was taken at), after which fences move on."""

from __future__ import annotations

import time

import httpx
import pytest

from statehouse.backends.bounds import MAX_EPOCH
from tests.support.server import start_server

pytestmark = [pytest.mark.http]


@pytest.fixture
def http(tmp_path):
    server = start_server(tmp_path, {"STATEHOUSE_BACKEND": "rocksdb"})
    try:
        with httpx.Client(base_url=server.url + "/v1/jobs", timeout=30) as client:
            yield client
    finally:
        server.stop()
    assert "Traceback" not in server.log()


def savepoint(http: httpx.Client, checkpoint_id: int) -> None:
    assert http.post("/j/checkpoints", json={"checkpoint_id": checkpoint_id, "kind": "savepoint"}).status_code == 202
    deadline = time.monotonic() + 30
    while (done := http.post(f"/j/checkpoints/{checkpoint_id}/complete")).status_code == 409:
        assert time.monotonic() < deadline, done.text
        time.sleep(0.05)
    assert done.status_code == 200, done.text


def test_the_epoch_ceiling_is_refused_with_the_way_out_and_the_way_out_works(http):
    assert http.put("/j", json={"max_parallelism": 128}).status_code == 201
    assert http.put("/j/states/v", json={"kind": "value"}).status_code == 201
    assert http.post("/j/fence", json={"epoch": 0, "next": True}).json()["epoch"] == 1
    assert http.put("/j/states/v/keys/k", json={"value": "before"}).status_code == 204
    savepoint(http, 5)  # at epoch 1

    assert http.post("/j/fence", json={"epoch": MAX_EPOCH}).json()["epoch"] == MAX_EPOCH
    stuck = http.post("/j/fence", json={"epoch": 0, "next": True})
    assert stuck.status_code == 422 and stuck.json()["code"] == "invalid_argument", stuck.text
    detail = stuck.json()["detail"]
    assert "ceiling" in detail and "delete the job and restore" in detail, detail
    # Writes under the ceiling epoch still work.
    written = http.post(
        "/j/batch", json={"epoch": MAX_EPOCH, "ops": [{"op": "put", "state": "v", "key": "k", "value": 2}]}
    )
    assert written.status_code == 200, written.text
    assert http.get("/j").json()["epoch"] == MAX_EPOCH

    # The way out the refusal names: delete, then restore the snapshot taken before the fence.
    assert http.delete("/j").status_code == 204
    restored = http.post("/j/restore", json={"checkpoint_id": 5})
    assert restored.status_code == 200, restored.text
    assert http.get("/j").json()["epoch"] == 1
    assert http.post("/j/fence", json={"epoch": 0, "next": True}).json()["epoch"] == 2
    assert http.get("/j/states/v/keys/k").json() == {"value": "before"}
