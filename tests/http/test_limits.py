"""Resource limits over real HTTP, on RocksDB (the production default): jobs per replica, keyed
states per job, and open databases. Past a limit the answer is a clear problem, other jobs keep serving,
and freeing a slot (deleting a job or a state) lets the next one in."""

from __future__ import annotations

import re
import signal

import httpx
import pytest

from tests.support.server import start_server

pytestmark = [pytest.mark.http]

MAX_JOBS, MAX_STATES, MAX_OPEN = 4, 3, 2


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    server = start_server(
        tmp_path_factory.mktemp("limits"),
        {
            "STATEHOUSE_BACKEND": "rocksdb",
            "STATEHOUSE_MAX_JOBS": str(MAX_JOBS),
            "STATEHOUSE_MAX_STATES_PER_JOB": str(MAX_STATES),
            "STATEHOUSE_MAX_OPEN_JOBS": str(MAX_OPEN),
        },
    )
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http
    # A clean drain: uvicorn re-raises the SIGTERM after it (as PID 1 in a container it is ignored: 0).
    assert server.stop() in (0, -signal.SIGTERM) and "Application shutdown complete" in server.log()


def put_value(http: httpx.Client, job: str, state: str, key: str, value: object) -> None:
    r = http.put(f"/v1/jobs/{job}/states/{state}/keys/{key}", json={"value": value})
    assert r.status_code in (200, 204), r.text


def get_value(http: httpx.Client, job: str, state: str, key: str) -> object:
    r = http.get(f"/v1/jobs/{job}/states/{state}/keys/{key}")
    assert r.status_code == 200, r.text
    return r.json()["value"]


def register(http: httpx.Client, job: str, state: str) -> httpx.Response:
    return http.put(f"/v1/jobs/{job}/states/{state}", json={"kind": "value"})


def gauge(http: httpx.Client, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", http.get("/metrics").text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


def assert_problem(r: httpx.Response, code: str, variable: str) -> None:
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json"), r.text
    problem = r.json()
    assert problem["code"] == code and problem["type"] == f"/problems/{code}"
    assert variable in problem["detail"]


def test_jobs_up_to_the_limit_then_a_clear_refusal(limited):
    http = limited
    jobs = [f"j{i}" for i in range(MAX_JOBS)]
    for job in jobs:
        assert http.put(f"/v1/jobs/{job}").status_code == 201
        assert register(http, job, "v").status_code == 201
        put_value(http, job, "v", "k", job)
    assert gauge(http, "statehouse_jobs") == MAX_JOBS

    assert_problem(http.put("/v1/jobs/one-too-many"), "too_many_jobs", "STATEHOUSE_MAX_JOBS")
    assert http.get("/v1/jobs/one-too-many").status_code == 404  # nothing was created
    assert http.put(f"/v1/jobs/{jobs[0]}").status_code == 200  # confirming an existing job is no new job
    for job in jobs:  # every job still serves, reads and writes
        assert get_value(http, job, "v", "k") == job
        put_value(http, job, "v", "k2", 2)

    assert http.delete(f"/v1/jobs/{jobs[0]}").status_code == 204  # frees a slot
    assert http.put("/v1/jobs/one-too-many").status_code == 201
    assert_problem(http.put("/v1/jobs/two-too-many"), "too_many_jobs", "STATEHOUSE_MAX_JOBS")
    assert gauge(http, "statehouse_jobs") == MAX_JOBS
    # Five jobs were written through two open databases: the idle ones were closed and
    # reopened on demand, and no data went missing on the way.
    assert gauge(http, "statehouse_rocksdb_open_instances") <= MAX_OPEN
    for job in jobs[1:]:
        assert get_value(http, job, "v", "k") == job and get_value(http, job, "v", "k2") == 2
    assert gauge(http, "statehouse_rocksdb_open_instances") <= MAX_OPEN
    for job in [*jobs[1:], "one-too-many"]:
        assert http.delete(f"/v1/jobs/{job}").status_code == 204
    assert gauge(http, "statehouse_jobs") == 0


def test_states_up_to_the_limit_then_a_clear_refusal(limited):
    http = limited
    assert http.put("/v1/jobs/states").status_code == 201
    assert http.put("/v1/jobs/neighbour").status_code == 201
    assert register(http, "neighbour", "n").status_code == 201
    # "default" is RocksDB's own column family name: it works as a state name like any other.
    names = ["default", *(f"s{i}" for i in range(MAX_STATES - 1))]
    for name in names:
        assert register(http, "states", name).status_code == 201
        put_value(http, "states", name, "k", name)

    assert_problem(register(http, "states", "one-too-many"), "too_many_states", "STATEHOUSE_MAX_STATES_PER_JOB")
    assert http.get("/v1/jobs/states/states/one-too-many").status_code == 404
    assert register(http, "states", "default").status_code == 200  # re-registering is no new state
    # Operator states do not count: they are rows of shared tables.
    r = http.put("/v1/jobs/states/operators/src/subtasks/0/lists/offsets", json={"value": [1, 2]})
    assert r.status_code in (200, 204), r.text
    r = http.put("/v1/jobs/states/operators/rules/broadcast/cfg/entries/limit", json={"value": 10})
    assert r.status_code in (200, 204), r.text
    # Another job's states are its own.
    assert register(http, "neighbour", "m").status_code == 201
    put_value(http, "neighbour", "n", "k", 1)

    assert http.delete("/v1/jobs/states/states/s0").status_code == 204  # frees a slot
    assert register(http, "states", "one-too-many").status_code == 201
    assert get_value(http, "states", "default", "k") == "default"
    for job in ("states", "neighbour"):
        assert http.delete(f"/v1/jobs/{job}").status_code == 204


def test_restore_into_a_new_job_past_the_limit_is_refused(limited):
    http = limited
    jobs = [f"r{i}" for i in range(MAX_JOBS)]
    for job in jobs:
        assert http.put(f"/v1/jobs/{job}").status_code == 201
    assert register(http, "r0", "v").status_code == 201
    put_value(http, "r0", "v", "k", "saved")
    assert http.post("/v1/jobs/r0/checkpoints", json={"checkpoint_id": 1, "kind": "savepoint"}).status_code == 202
    r = http.post("/v1/jobs/r0/checkpoints/1/complete")
    while r.status_code == 409 and r.json()["code"] == "checkpoint_not_ready":
        r = http.post("/v1/jobs/r0/checkpoints/1/complete")
    assert r.status_code == 200, r.text
    location = r.json()["location"]

    r = http.post("/v1/jobs/restored/restore", json={"location": location})
    assert_problem(r, "too_many_jobs", "STATEHOUSE_MAX_JOBS")
    assert http.get("/v1/jobs/restored").status_code == 404
    # Restoring over a job the replica holds takes no new slot.
    put_value(http, "r0", "v", "k", "changed")
    assert http.post("/v1/jobs/r0/restore", json={"checkpoint_id": 1}).status_code == 200
    assert get_value(http, "r0", "v", "k") == "saved"

    assert http.delete(f"/v1/jobs/{jobs[-1]}").status_code == 204
    assert http.post("/v1/jobs/restored/restore", json={"location": location}).status_code == 200
    assert get_value(http, "restored", "v", "k") == "saved"
    for job in [*jobs[:-1], "restored"]:
        assert http.delete(f"/v1/jobs/{job}").status_code == 204
