"""Task attempts over HTTP: staged writes, read-your-writes, re-sent requests, and the epoch
commit (prepare, commit, abort) that applies each partition's winning attempt exactly once."""

import signal
import time

import httpx
import pytest

from tests.support.server import start_server

pytestmark = [pytest.mark.http]

ADD = {"op": "add", "state": "total", "key": "u"}


@pytest.fixture
def job(http, job_name):
    http.put(f"/jobs/{job_name}", json={"max_parallelism": 128})
    http.put(f"/jobs/{job_name}/states/total", json={"kind": "reducing", "function": "sum"})
    http.put(f"/jobs/{job_name}/states/items", json={"kind": "list"})
    return f"/jobs/{job_name}"


def fence(http, job, epoch):
    assert http.post(f"{job}/fence", json={"epoch": epoch}).json()["epoch"] == epoch


def staged(http, job, epoch, partition, attempt, seq, ops):
    return http.post(
        f"{job}/batch", json={"epoch": epoch, "partition": partition, "attempt": attempt, "seq": seq, "ops": ops}
    )


def total(http, job, key="u"):
    r = http.get(f"{job}/states/total/keys/{key}")
    return r.json()["value"] if r.status_code == 200 else None


def winners(*attempts):
    return {"attempts": [{"partition": p, "attempt": a, "ops": n} for p, a, n in attempts]}


def test_staged_writes_are_private_until_the_commit(http, job):
    http.post(f"{job}/batch", json={"ops": [{**ADD, "value": 100}]}).raise_for_status()
    fence(http, job, 1)
    r = staged(http, job, 1, 0, "t1", 0, [{**ADD, "value": 5}, {"op": "get", "state": "total", "key": "u"}])
    assert r.json()["results"] == [{}, {"value": 105}]  # the attempt reads its own writes
    r = staged(http, job, 1, 1, "t2", 0, [{"op": "get", "state": "total", "key": "u"}])
    assert r.json()["results"] == [{"value": 100}]  # another attempt does not see them
    assert total(http, job) == 100  # nor does anyone else
    report = http.get(f"{job}/epochs/1").json()
    assert report["status"] == "open"
    assert [(a["partition"], a["attempt"], a["ops"]) for a in report["attempts"]] == [(0, "t1", 1), (1, "t2", 0)]
    assert http.post(f"{job}/epochs/1/commit", json=winners((0, "t1", 1))).json()["ops"] == 1
    assert total(http, job) == 105
    info = http.get(job).json()
    assert (info["epoch"], info["committed_epoch"]) == (1, 1)


def test_a_retried_task_and_a_speculative_duplicate_count_once(http, job):
    fence(http, job, 3)
    # partition 0: attempt a0 fails after its writes; a1 (the retry) and a2 (speculative) both finish
    for attempt in ("a0", "a1", "a2"):
        staged(http, job, 3, 0, attempt, 0, [{**ADD, "value": 10}]).raise_for_status()
        staged(http, job, 3, 0, attempt, 1, [{**ADD, "value": 1}]).raise_for_status()
    # partition 1 adds to the same key: both partitions count, whatever order they ran in
    staged(http, job, 3, 1, "b0", 0, [{**ADD, "value": 100}]).raise_for_status()
    body = winners((0, "a1", 2), (1, "b0", 1))
    assert http.post(f"{job}/epochs/3/prepare", json=body).json()["status"] == "sealed"
    assert http.post(f"{job}/epochs/3/commit", json=body).json()["status"] == "committed"
    assert total(http, job) == 111
    # A commit re-sent (the driver did not see the answer) does nothing again.
    again = http.post(f"{job}/epochs/3/commit", json=body)
    assert again.status_code == 200 and total(http, job) == 111
    assert http.get(f"{job}/epochs/3").json()["attempts"] == []  # the losers' writes are gone


def test_a_resent_request_is_answered_again_not_applied_twice(http, job):
    fence(http, job, 1)
    first = staged(http, job, 1, 0, "t", 0, [{**ADD, "value": 5}, {"op": "get", "state": "total", "key": "u"}])
    again = staged(http, job, 1, 0, "t", 0, [{**ADD, "value": 5}, {"op": "get", "state": "total", "key": "u"}])
    assert first.json() == again.json() == {"results": [{}, {"value": 5}]}
    gap = staged(http, job, 1, 0, "t", 2, [{**ADD, "value": 1}])
    assert gap.status_code == 409 and gap.json()["code"] == "attempt_conflict"
    http.post(f"{job}/epochs/1/commit", json=winners((0, "t", 1))).raise_for_status()
    assert total(http, job) == 5


def test_a_failed_request_stages_nothing(http, job):
    fence(http, job, 1)
    staged(http, job, 1, 0, "t", 0, [{**ADD, "value": 5}]).raise_for_status()
    bad = staged(http, job, 1, 0, "t", 1, [{**ADD, "value": 1}, {**ADD, "value": "x"}])
    assert bad.status_code == 422 and bad.json()["op_index"] == 1
    r = staged(http, job, 1, 0, "t", 1, [{"op": "get", "state": "total", "key": "u"}])
    assert r.json()["results"] == [{"value": 5}]
    assert http.get(f"{job}/epochs/1").json()["attempts"][0]["ops"] == 1


def test_zombies_and_late_writes_are_refused(http, job):
    fence(http, job, 2)
    old = staged(http, job, 1, 0, "z", 0, [{**ADD, "value": 1}])
    assert old.status_code == 409 and old.json()["code"] == "stale_epoch"
    staged(http, job, 2, 0, "t", 0, [{**ADD, "value": 1}]).raise_for_status()
    http.post(f"{job}/epochs/2/prepare", json=winners((0, "t", 1))).raise_for_status()
    late = staged(http, job, 2, 1, "late", 0, [{**ADD, "value": 1}])
    assert late.status_code == 409 and late.json()["code"] == "epoch_sealed"
    fence(http, job, 3)  # the driver gave up on epoch 2: its staging is dropped
    commit = http.post(f"{job}/epochs/2/commit", json=winners((0, "t", 1)))
    assert commit.status_code == 409 and commit.json()["code"] == "stale_epoch"
    assert total(http, job) is None


def test_prepare_names_what_a_replica_does_not_hold(http, job):
    fence(http, job, 1)
    staged(http, job, 1, 0, "t", 0, [{**ADD, "value": 1}]).raise_for_status()
    r = http.post(f"{job}/epochs/1/prepare", json=winners((0, "t", 2), (1, "gone", 1)))
    assert r.status_code == 409 and r.json()["code"] == "attempt_lost"
    assert r.json()["attempts"] == [
        {"partition": 0, "attempt": "t", "expected": 2, "held": 1},
        {"partition": 1, "attempt": "gone", "expected": 1, "held": 0},
    ]
    assert http.post(f"{job}/epochs/1/abort").json()["status"] == "none"
    assert total(http, job) is None


@pytest.mark.parametrize(
    "body",
    [
        {"epoch": 1, "attempt": "t", "seq": 0, "ops": []},  # no partition
        {"epoch": 1, "partition": -1, "attempt": "t", "seq": 0, "ops": []},
        {"epoch": 1, "partition": 0, "attempt": "a b", "seq": 0, "ops": []},
        {"epoch": 1, "partition": 0, "attempt": "t\n", "seq": 0, "ops": []},
        {"epoch": 1, "partition": 0, "attempt": "t", "seq": True, "ops": []},
    ],
)
def test_attempt_fields_are_validated(http, job, body):
    fence(http, job, 1)
    r = http.post(f"{job}/batch", json=body)
    assert r.status_code == 422 and r.json()["code"] == "invalid_argument", r.json()


def test_an_attempt_without_epoch_is_refused(http, job):
    r = http.post(f"{job}/batch", json={"partition": 0, "attempt": "t", "seq": 0, "ops": []})
    assert r.status_code == 409 and r.json()["code"] == "attempt_conflict"


def test_staging_is_bounded(tmp_path):
    server = start_server(tmp_path, {"STATEHOUSE_MAX_STAGED_BYTES": "30000", "STATEHOUSE_BACKEND": "heap"})
    try:
        with httpx.Client(base_url=server.url + "/v1") as http:
            http.put("/jobs/j", json={"max_parallelism": 8}).raise_for_status()
            http.put("/jobs/j/states/total", json={"kind": "reducing", "function": "sum"}).raise_for_status()
            http.post("/jobs/j/fence", json={"epoch": 1}).raise_for_status()
            ops = [{**ADD, "value": 1}] * 20  # about 1,300 request bytes + 20 x 512 a request
            assert [staged(http, "/jobs/j", 1, 0, "t", seq, ops).status_code for seq in (0, 1)] == [200, 200]
            for _ in range(2):  # refused, and nothing of it staged
                over = staged(http, "/jobs/j", 1, 0, "t", 2, ops).json()
                assert over["code"] == "staging_too_large" and "STATEHOUSE_MAX_STAGED_BYTES" in over["detail"]
            read = staged(http, "/jobs/j", 1, 0, "t", 2, [{"op": "get", "state": "total", "key": "u"}])
            assert read.json()["results"] == [{"value": 40}]
    finally:
        server.stop()


def test_a_restarted_replica_fails_the_commit_loudly(tmp_path):
    """RocksDB keeps the state over a SIGKILL, not what attempts staged: the attempt's next
    request and the driver's prepare say so instead of committing part of the batch."""
    server = start_server(tmp_path, {"STATEHOUSE_BACKEND": "rocksdb"})
    try:
        with httpx.Client(base_url=server.url + "/v1") as http:
            http.put("/jobs/j", json={"max_parallelism": 8}).raise_for_status()
            http.put("/jobs/j/states/total", json={"kind": "reducing", "function": "sum"}).raise_for_status()
            http.post("/jobs/j/fence", json={"epoch": 1}).raise_for_status()
            staged(http, "/jobs/j", 1, 0, "t", 0, [{**ADD, "value": 7}]).raise_for_status()
        server.stop(signal.SIGKILL)
        server = start_server(tmp_path, server.settings, port=int(server.url.rsplit(":", 1)[1]))
        with httpx.Client(base_url=server.url + "/v1") as http:
            assert http.get("/jobs/j").json()["epoch"] == 1  # durable
            lost = staged(http, "/jobs/j", 1, 0, "t", 1, [{**ADD, "value": 1}])
            assert lost.status_code == 409 and lost.json()["code"] == "attempt_lost"
            r = http.post("/jobs/j/epochs/1/prepare", json=winners((0, "t", 1)))
            assert r.status_code == 409 and r.json()["code"] == "attempt_lost"
            assert http.get("/jobs/j/states/total/keys/u").status_code == 404
    finally:
        server.stop()


def test_a_checkpoint_records_the_committed_epoch_and_batch_and_a_restore_brings_them_back(http, job):
    """The micro-batch a commit names is the job's state (the exactly-once anchor): answered by the
    job and the fence, recorded by every checkpoint whoever triggers it, restored with the state."""
    fence(http, job, 1)
    staged(http, job, 1, 0, "t", 0, [{**ADD, "value": 1}]).raise_for_status()
    http.post(f"{job}/epochs/1/commit", json={**winners((0, "t", 1)), "batch_id": 7}).raise_for_status()
    assert http.get(job).json()["committed_batch"] == 7
    assert http.post(f"{job}/fence", json={"epoch": 1}).json()["committed_batch"] == 7
    http.post(f"{job}/checkpoints", json={"checkpoint_id": 1}).raise_for_status()  # no metadata: anyone's
    for _ in range(200):
        if http.get(f"{job}/checkpoints/1").json()["status"] == "uploaded":
            break
    done = http.post(f"{job}/checkpoints/1/complete").json()
    assert (done["committed_epoch"], done["committed_batch"]) == (1, 7)
    fence(http, job, 2)
    staged(http, job, 2, 0, "t", 0, [{**ADD, "value": 1}]).raise_for_status()
    http.post(f"{job}/epochs/2/commit", json={**winners((0, "t", 1)), "batch_id": 8}).raise_for_status()
    assert (http.get(job).json()["committed_epoch"], http.get(job).json()["committed_batch"]) == (2, 8)
    http.post(f"{job}/restore", json={"checkpoint_id": 1}).raise_for_status()
    info = http.get(job).json()
    assert (info["committed_epoch"], info["epoch"]) == (1, 3)  # the state's epoch back, the writers' advanced
    assert info["committed_batch"] == 7 and total(http, job) == 1
    for bad in (-1, "7", 1.5):
        refused = http.post(f"{job}/epochs/3/commit", json={**winners(), "batch_id": bad})
        assert refused.status_code == 422, (bad, refused.text)


def test_a_begun_micro_batch_holds_a_live_rescale_prepare_off_until_it_ends(tmp_path):
    """A fence that begins a micro-batch is its boundary: until its epoch is committed or aborted, a
    move's prepare on this replica answers 409 batch_in_flight and freezes nothing; a fence during a
    prepared move names it. Past STATEHOUSE_BATCH_LEASE_S without a sign of life (its driver died),
    a begun batch holds nothing."""
    server = start_server(tmp_path, {"STATEHOUSE_BACKEND": "rocksdb", "STATEHOUSE_BATCH_LEASE_S": "1"})
    begins = {"epoch": 0, "next": True, "begins_batch": True}
    try:
        with httpx.Client(base_url=server.url + "/v1") as http:
            http.put("/jobs/j", json={"max_parallelism": 8}).raise_for_status()
            begun = http.post("/jobs/j/fence", json=begins).json()
            assert begun["rescale_version"] is None and begun["topology_version"] == 1
            body = {"version": 2, "replica_count": 2, "initiator": "query:j"}
            held = http.post("/topology/prepare", json=body)
            assert held.status_code == 409 and held.json()["code"] == "batch_in_flight", held.text
            assert http.get("/topology").json()["move"] is None
            http.post(f"/jobs/j/epochs/{begun['epoch']}/abort").raise_for_status()
            prepared = http.post("/topology/prepare", json=body)
            assert prepared.status_code == 200 and prepared.json()["move"]["initiator"] == "query:j"
            assert http.post("/jobs/j/fence", json=begins).json()["rescale_version"] == 2  # the coordinator waits
            http.post("/topology/abort", json={"version": 2}).raise_for_status()
            http.post("/jobs/j/fence", json=begins).raise_for_status()  # begun, then its driver is silent
            time.sleep(1.5)
            assert http.post("/topology/prepare", json={"version": 3, "replica_count": 2}).status_code == 200
            http.post("/topology/abort", json={"version": 3}).raise_for_status()
    finally:
        server.stop()


@pytest.mark.parametrize(
    "urls",
    [["file:///etc/passwd"], ["javascript:x"], ["http://[::1"], ["http://a:8000/path"], ["x" * 3000]],
)
def test_a_prepare_refuses_replica_urls_clients_could_not_use(http, urls):
    refused = http.post("/topology/prepare", json={"version": 99, "replica_count": len(urls), "replica_urls": urls})
    assert refused.status_code == 422, refused.text
    assert http.get("/topology").json()["move"] is None


def test_a_fence_with_next_takes_an_epoch_past_any_and_answers_the_committed_one(http, job):
    """A coordinator's begin in one round trip: `next` raises the epoch past the current one (and to
    at least `epoch`), and the answer names the last committed epoch, which it would otherwise read."""
    fence(http, job, 5)
    assert fenced(http.post(f"{job}/fence", json={"epoch": 1, "next": True})) == (6, 0)
    assert http.post(f"{job}/fence", json={"epoch": 9, "next": True}).json()["epoch"] == 9
    assert staged(http, job, 9, 0, "a", 0, [{"op": "add", "state": "total", "key": "u", "value": 2}]).status_code == 200
    assert http.post(f"{job}/epochs/9/commit", json=winners((0, "a", 1))).status_code == 200
    assert fenced(http.post(f"{job}/fence", json={"epoch": 0, "next": True})) == (10, 9)
    assert staged(http, job, 9, 0, "b", 0, [{"op": "add", "state": "total", "key": "u", "value": 2}]).status_code == 409
    for bad in ({"epoch": 1, "next": "true"}, {"epoch": 1, "next": 1}, {"next": True}):
        refused = http.post(f"{job}/fence", json=bad)
        assert refused.status_code == 422, (bad, refused.text)
    assert http.get(job).json()["epoch"] == 10 and total(http, job) == 2


def fenced(answer) -> tuple[int, int]:
    body = answer.json()
    return body["epoch"], body["committed_epoch"]
