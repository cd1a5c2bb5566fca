"""The epoch commit refuses what would double, and the integers it takes stay in their ranges,
over real HTTP."""

from __future__ import annotations

import httpx
import pytest

from statehouse.backends.bounds import MAX_CHECKPOINT_ID, MAX_EPOCH
from statehouse.snapshots.stored.names import NAME_PATTERN
from tests.support.arrow_ipc import arrow, post
from tests.support.problems import problem

pytestmark = [pytest.mark.http]


@pytest.fixture
def job(http, job_name):
    http.put(f"/jobs/{job_name}", json={"max_parallelism": 128}).raise_for_status()
    http.put(f"/jobs/{job_name}/states/total", json={"kind": "reducing", "function": "sum"}).raise_for_status()
    http.post(f"/jobs/{job_name}/fence", json={"epoch": 1}).raise_for_status()
    return f"/jobs/{job_name}"


def stage(http, job, attempt, value=5, partition=0, epoch=1, seq=0):
    body = {"ops": [{"op": "add", "state": "total", "key": "k", "value": value}], "epoch": epoch}
    return http.post(f"{job}/batch", json={**body, "partition": partition, "attempt": attempt, "seq": seq})


def total(http, job):
    r = http.get(f"{job}/states/total/keys/k")
    return r.json()["value"] if r.status_code == 200 else None


def winners(*named):
    return {"attempts": [{"partition": p, "attempt": a, "ops": n} for p, a, n in named]}


def test_two_winners_of_one_partition_are_refused(http, job):
    """Before: a1 and a2 of partition 0 both committed: 200, and the value was 10."""
    for attempt in ("a1", "a2"):
        assert stage(http, job, attempt).status_code == 200
    both = winners((0, "a1", 1), (0, "a2", 1))
    for step in ("prepare", "commit"):
        body = problem(http.post(f"{job}/epochs/1/{step}", json=both), 409, "attempt_conflict")
        assert "partition 0 is named twice" in body["detail"], body
    assert total(http, job) is None  # nothing applied
    one = winners((0, "a2", 1))
    assert http.post(f"{job}/epochs/1/prepare", json=one).status_code == 200
    assert http.post(f"{job}/epochs/1/commit", json=one).json()["ops"] == 1
    assert total(http, job) == 5


def test_attempts_of_two_units_of_one_partition_both_commit(http, job):
    """One Spark task running two state updates (two ``with_state`` calls) has an attempt per
    unit, both of its partition: named with their units, both apply; one unit named twice is
    still refused."""
    for attempt in ("u.a1", "v.a1", "v.a2"):
        assert stage(http, job, attempt).status_code == 200
    twice = {"attempts": [{"partition": 0, "attempt": a, "ops": 1, "unit": "v"} for a in ("v.a1", "v.a2")]}
    body = problem(http.post(f"{job}/epochs/1/prepare", json=twice), 409, "attempt_conflict")
    assert "partition 0 of unit 'v' is named twice" in body["detail"], body
    both = {"attempts": [{"partition": 0, "attempt": f"{u}.a1", "ops": 1, "unit": u} for u in ("u", "v")]}
    assert http.post(f"{job}/epochs/1/prepare", json=both).status_code == 200
    assert http.post(f"{job}/epochs/1/commit", json=both).json()["ops"] == 2
    assert total(http, job) == 10


def test_a_winner_that_staged_nothing_here_commits_only_with_no_writes(http, job):
    """A task with no writes on a replica is a winner that staged nothing (Spark pipelines send
    it); one that counted writes this replica does not hold is lost, never taken as empty."""
    assert stage(http, job, "a1").status_code == 200
    problem(http.post(f"{job}/epochs/1/prepare", json=winners((0, "a1", 1), (1, "ghost", 3))), 409, "attempt_lost")
    named = winners((0, "a1", 1), (1, "idle", 0))
    assert http.post(f"{job}/epochs/1/prepare", json=named).status_code == 200
    assert http.post(f"{job}/epochs/1/commit", json=named).status_code == 200
    assert total(http, job) == 5


def test_a_batch_staged_into_a_committed_epoch_is_refused(http, job):
    """Before: 200, and its writes were dropped silently."""
    assert stage(http, job, "a1").status_code == 200
    named = winners((0, "a1", 1))
    assert http.post(f"{job}/epochs/1/commit", json=named).status_code == 200
    late = stage(http, job, "late", value=100, partition=1)
    body = problem(late, 409, "epoch_sealed")
    assert "was committed" in body["detail"], body
    assert http.get(f"{job}/epochs/1").json()["status"] == "committed"
    assert http.post(f"{job}/epochs/1/commit", json=named).status_code == 200  # a re-sent commit: done already
    assert total(http, job) == 5


def test_epochs_beyond_int64_are_refused_and_the_largest_works(http, job):
    """Before: fencing 2**63 answered 200, and the epoch's endpoints 422 forever after."""
    body = problem(http.post(f"{job}/fence", json={"epoch": MAX_EPOCH + 1}), 422, "validation_error")
    assert str(MAX_EPOCH) in str(body), body
    assert http.get(job).json()["epoch"] == 1
    problem(stage(http, job, "a", epoch=MAX_EPOCH + 1), 422, "invalid_argument")
    assert http.post(f"{job}/fence", json={"epoch": MAX_EPOCH}).json()["epoch"] == MAX_EPOCH
    assert stage(http, job, "a", epoch=MAX_EPOCH).status_code == 200
    named = winners((0, "a", 1))
    assert http.post(f"{job}/epochs/{MAX_EPOCH}/commit", json=named).json()["status"] == "committed"
    problem(stage(http, job, "b", epoch=1), 409, "stale_epoch")  # rendered: the epoch fits the answer
    assert total(http, job) == 5


def test_checkpoint_ids_beyond_int64_are_refused(http, job):
    """Before: ids ≥ 2**63 were accepted, and automatic ids passed 2**64."""
    trigger = f"{job}/checkpoints"
    problem(http.post(trigger, json={"checkpoint_id": MAX_CHECKPOINT_ID + 1}), 422, "validation_error")
    problem(http.get(f"{trigger}/{MAX_CHECKPOINT_ID + 1}"), 422, "validation_error")
    r = http.post(trigger, json={"checkpoint_id": MAX_CHECKPOINT_ID})
    assert r.status_code == 202, r.text
    http.get(f"{trigger}/{MAX_CHECKPOINT_ID}", params={"wait_ms": 5000}).raise_for_status()
    body = problem(http.post(trigger, json={}), 409, "checkpoint_conflict")
    assert "no id follows it" in body["detail"], body


@pytest.mark.parametrize("text", ["-0", "00", "+1", " 1"])
def test_numbers_in_paths_and_queries_have_one_form(http, job, text):
    """Before: ``-0`` was taken as 0 (int keys, timestamps, subtasks, epochs)."""
    http.put(f"{job}/states/by_int", json={"kind": "value", "key_type": "int"}).raise_for_status()
    problem(http.get(f"{job}/states/by_int/keys/{text}"), 422, "invalid_key")
    problem(http.get(f"{job}/epochs/{text}"), 422, "validation_error")
    problem(http.put(f"{job}/timers/event/keys/k/{text}"), 422, "validation_error")
    problem(http.get(f"{job}/operators/op/subtasks/{text}/lists/l"), 422, "validation_error")
    problem(post(http, job, "total", "get", arrow(key=["k"]), params={"epoch": text}), 422, "invalid_argument")


@pytest.mark.parametrize("escape", ["%ff", "%fe", "%c3", "%ff%fe"])
def test_query_strings_are_as_strict_as_paths(http, job, escape):
    """Before: ``?ns=%ff``, ``%fe``, ``%c3`` and ``%EF%BF%BD`` all named one namespace (U+FFFD)."""
    http.put(f"{job}/states/v", json={"kind": "value"}).raise_for_status()
    http.put(f"{job}/states/v/keys/k", params={"ns": "\ufffd"}, json={"value": 1}).raise_for_status()
    body = problem(http.get(f"{job}/states/v/keys/k?ns={escape}"), 422, "invalid_argument")
    assert "query string is not UTF-8" in body["detail"], body
    assert http.get(f"{job}/states/v/keys/k?ns=%EF%BF%BD").json()["value"] == 1  # U+FFFD itself, UTF-8
    fast = post(http, job, "total", "get", arrow(key=["k"]), params=None)
    assert fast.status_code == 200, fast.text
    problem(
        http.post(
            f"{job}/states/total/columns/get?attempt={escape}",
            content=arrow(key=["k"]),
            headers={"content-type": "application/vnd.apache.arrow.stream"},
        ),
        422,
        "invalid_argument",
    )


def test_the_openapi_document_declares_what_the_server_enforces(http, job):
    spec = httpx.get(str(http.base_url).removesuffix("/v1/") + "/openapi.json", timeout=60).json()
    for path, item in spec["paths"].items():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] in ("job", "state", "operator", "name"):
                    assert parameter["schema"].get("pattern") == NAME_PATTERN, (path, parameter)
                if parameter["name"] == "cursor":
                    assert parameter["schema"]["minLength"] == 1, (path, parameter)
    problem(http.get(f"{job}/states/total/keys", params={"cursor": ""}), 422, "invalid_argument")
    # A name with a final newline is not a name ("$" of the pattern is the end, in Python too).
    refused = http.put(f"{job}/operators/op%0A/subtasks/0/lists/l", json={"value": [1]})
    problem(refused, 422, "invalid_name")
