"""The topology each replica persists and enforces, over real server processes.

- a restart with another replica count (or index) is refused with one line saying what to do, the
  data stays intact, and a restart with the right count serves it;
- STATEHOUSE_ADOPT_TOPOLOGY=1 serves the new layout: jobs written under the old one answer 409
  ``layout_mismatch`` until a restore (the rescale procedure) replaces them, or are deleted;
- a second process on a data directory exits at once, naming the holder's pid (both backends);
- GET /v1/topology shows the set, version and each job's range; 421s carry the version.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import pytest

from tests.support.server import ServerProcess, refused_start, start_server

pytestmark = [pytest.mark.http, pytest.mark.slow]

JOB = "orders"
KEYS = [f"user-{i}" for i in range(40)]


def run_refused(workdir: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    """Start a server that is expected to refuse to start; (exit status, its ``statehouse:`` lines)."""
    code, _stdout, stderr = refused_start(workdir, env)
    return code, [line for line in stderr.splitlines() if line.startswith("statehouse:")]


def replica(index: int, count: int, **more: str) -> dict[str, str]:
    return {"STATEHOUSE_REPLICA_INDEX": str(index), "STATEHOUSE_REPLICA_COUNT": str(count), **more}


def fill(server: ServerProcess) -> None:
    with httpx.Client(base_url=f"{server.url}/v1/jobs", timeout=30) as http:
        assert http.put(JOB, json={"max_parallelism": 128}).status_code == 201
        assert http.put(f"{JOB}/states/total", json={"kind": "value"}).status_code == 201
        ops = [{"op": "put", "state": "total", "key": k, "value": i} for i, k in enumerate(KEYS)]
        assert http.post(f"{JOB}/batch", json={"ops": ops}).status_code == 200


def read_all(server: ServerProcess) -> dict[str, httpx.Response]:
    with httpx.Client(base_url=f"{server.url}/v1/jobs", timeout=30) as http:
        return {k: http.get(f"{JOB}/states/total/keys/{k}") for k in KEYS}


def topology(server: ServerProcess) -> dict:
    got = httpx.get(f"{server.url}/v1/topology", timeout=10)
    assert got.status_code == 200, got.text
    return got.json()


def savepoint(server: ServerProcess, checkpoint_id: int) -> None:
    with httpx.Client(base_url=f"{server.url}/v1/jobs", timeout=30) as http:
        trigger = http.post(f"{JOB}/checkpoints", json={"checkpoint_id": checkpoint_id, "kind": "savepoint"})
        assert trigger.status_code == 202, trigger.text
        waited = http.get(f"{JOB}/checkpoints/{checkpoint_id}", params={"wait_ms": 10_000}).json()
        assert waited["status"] in ("uploaded", "completed"), waited
        assert http.post(f"{JOB}/checkpoints/{checkpoint_id}/complete").json()["status"] == "completed"


def test_restart_with_another_count_is_refused_then_served_with_the_right_one(tmp_path):
    server = start_server(tmp_path, replica(0, 1))
    try:
        fill(server)
        before = topology(server)
        assert before["replica_count"] == 1 and before["replica_index"] == 0 and before["version"] == 1
        assert before["persisted"] is True
        assert before["jobs"] == [{"job": JOB, "max_parallelism": 128, "key_group_range": [0, 127], "serving": True}]
    finally:
        server.stop()
    stored = json.loads((tmp_path / "data" / "$topology.json").read_text())
    assert stored["set_id"] == before["set_id"] and stored["jobs"][JOB]["key_group_range"] == [0, 127]

    code, lines = run_refused(tmp_path, replica(0, 2))
    assert code == 2
    assert lines == [
        f"statehouse: STATEHOUSE_DATA_DIR={str(tmp_path / 'data')!r}: holds replica 0 of 1 (topology version 1), "
        "but STATEHOUSE_REPLICA_INDEX=0 and STATEHOUSE_REPLICA_COUNT=2: start it with STATEHOUSE_REPLICA_INDEX=0 "
        "STATEHOUSE_REPLICA_COUNT=1, or, to rescale, add STATEHOUSE_ADOPT_TOPOLOGY=1 and restore every job from a "
        "savepoint (docs/operations.md, Rescaling)"
    ]
    code, lines = run_refused(tmp_path, replica(1, 2))  # another index is refused the same way
    assert code == 2 and "holds replica 0 of 1" in lines[0]
    assert json.loads((tmp_path / "data" / "$topology.json").read_text()) == stored  # untouched by the refusals

    server = start_server(tmp_path, replica(0, 1))
    try:
        values = read_all(server)
        assert {k: r.json()["value"] for k, r in values.items()} == {k: i for i, k in enumerate(KEYS)}
        assert topology(server) == before
    finally:
        server.stop()


def test_adopt_refuses_old_jobs_until_restored(tmp_path):
    shared = {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "storage")}
    server = start_server(tmp_path, replica(0, 1, **shared))
    try:
        fill(server)
        savepoint(server, 5)
        set_id = topology(server)["set_id"]
    finally:
        server.stop()

    server = start_server(tmp_path, replica(0, 2, STATEHOUSE_ADOPT_TOPOLOGY="1", **shared))
    try:
        adopted = topology(server)
        assert (adopted["set_id"], adopted["version"], adopted["replica_count"]) == (set_id, 2, 2)
        assert adopted["jobs"] == [{"job": JOB, "max_parallelism": 128, "key_group_range": [0, 127], "serving": False}]
        with httpx.Client(base_url=f"{server.url}/v1", timeout=30) as http:
            refused = http.get(f"/jobs/{JOB}/states/total/keys/{KEYS[0]}")
            assert refused.status_code == 409, refused.text
            problem = refused.json()
            assert problem["code"] == "layout_mismatch" and problem["version"] == 2
            assert "holds key groups 0-127" in problem["detail"] and "owns 0-63" in problem["detail"]
            assert "restore the job from a savepoint" in problem["detail"]
            assert http.post(f"/jobs/{JOB}/checkpoints", json={}).json()["code"] == "layout_mismatch"
            for body in ({"max_parallelism": 128}, None):  # not a 200 for a job it does not serve
                again = http.put(f"/jobs/{JOB}", json=body)
                assert (again.status_code, again.json()["code"]) == (409, "layout_mismatch"), again.text
            assert [j["job"] for j in http.get("/jobs").json()["items"]] == [JOB]  # still listed

            # The rescale procedure's restore replaces it with this replica's range of the savepoint.
            restored = http.post(f"/jobs/{JOB}/restore", json={"checkpoint_id": 5})
            assert restored.status_code == 200, restored.text
            assert restored.json()["key_group_range"] == [0, 63]
        after = topology(server)
        assert after["jobs"] == [{"job": JOB, "max_parallelism": 128, "key_group_range": [0, 63], "serving": True}]
        owned = 0
        for i, (key, got) in enumerate(read_all(server).items()):
            if got.status_code == 200:
                assert got.json()["value"] == i
                owned += 1
            else:  # the other half: 421 naming the owner and the topology version
                assert got.status_code == 421, got.text
                assert (got.json()["owner"], got.json()["version"]) == (1, 2), key
        assert 0 < owned < len(KEYS)
    finally:
        server.stop()

    # Adopted is now the recorded topology: the old count is refused, the new one serves.
    code, lines = run_refused(tmp_path, replica(0, 1, **shared))
    assert code == 2 and "holds replica 0 of 2 (topology version 2)" in lines[0]
    server = start_server(tmp_path, replica(0, 2, **shared))
    try:
        assert topology(server)["jobs"][0]["serving"] is True
    finally:
        server.stop()


def test_a_job_refused_for_its_layout_can_be_deleted(tmp_path):
    server = start_server(tmp_path, replica(0, 1))
    try:
        fill(server)
    finally:
        server.stop()
    server = start_server(tmp_path, replica(1, 3, STATEHOUSE_ADOPT_TOPOLOGY="true"))
    try:
        with httpx.Client(base_url=f"{server.url}/v1", timeout=30) as http:
            assert http.get(f"/jobs/{JOB}").json()["code"] == "layout_mismatch"
            assert http.delete(f"/jobs/{JOB}").status_code == 204
            assert http.get(f"/jobs/{JOB}").json()["code"] == "job_not_found"
            assert topology(server)["jobs"] == []
            # A new job under the adopted topology is served with its range.
            assert http.put(f"/jobs/{JOB}", json={"max_parallelism": 128}).status_code == 201
        assert topology(server)["jobs"][0]["key_group_range"] == [43, 85]
    finally:
        server.stop()


def test_another_replica_set_is_refused(tmp_path):
    server = start_server(tmp_path, replica(0, 1, STATEHOUSE_REPLICA_SET_ID="shop"))
    try:
        assert topology(server)["set_id"] == "shop"
    finally:
        server.stop()
    code, lines = run_refused(tmp_path, replica(0, 1, STATEHOUSE_REPLICA_SET_ID="other"))
    assert code == 2 and "of replica set 'shop', not of STATEHOUSE_REPLICA_SET_ID='other'" in lines[0]


@pytest.mark.parametrize("backend", ["rocksdb", "heap"])
def test_a_second_process_on_the_data_dir_exits_at_once(tmp_path, backend):
    first = start_server(tmp_path, {"STATEHOUSE_BACKEND": backend})
    try:
        code, lines = run_refused(tmp_path, {"STATEHOUSE_BACKEND": backend})
        assert code == 2
        assert lines == [
            f"statehouse: STATEHOUSE_DATA_DIR={str(tmp_path / 'data')!r}: is in use by another statehouse process "
            f"(pid {first.process.pid}); each replica needs its own data directory"
        ]
        assert httpx.get(first.url + "/readyz", timeout=5).status_code == 200  # the first one is unharmed
    finally:
        first.stop()
    second = start_server(tmp_path, {"STATEHOUSE_BACKEND": backend})  # the lock went with the process
    second.stop()


def test_heap_keeps_its_topology_in_memory(tmp_path):
    server = start_server(tmp_path, replica(0, 1, STATEHOUSE_BACKEND="heap"))
    server.stop()
    assert not (tmp_path / "data" / "$topology.json").exists()
    server = start_server(tmp_path, replica(1, 2, STATEHOUSE_BACKEND="heap"))  # nothing survived to re-slice
    try:
        shown = topology(server)
        placed = (shown["replica_index"], shown["replica_count"], shown["version"], shown["persisted"])
        assert placed == (1, 2, 1, False)
    finally:
        server.stop()


def test_the_client_orders_its_urls_and_names_what_is_wrong(two_replicas, tmp_path):
    from statehouse.client import LayoutError, StatehouseClient

    urls = [s.url for s in two_replicas]
    with StatehouseClient(urls) as sh:
        shown = sh.topology()
        assert [(t["replica_index"], t["replica_count"]) for t in shown] == [(0, 2), (1, 2)]
        assert shown[0]["set_id"] == shown[1]["set_id"]  # named after the checkpoint storage they share
        assert shown[0]["replica_urls"] == []  # STATEHOUSE_REPLICA_URLS unset: nothing advertised
    with StatehouseClient(urls[::-1]) as sh:  # any order: put in replica-index order
        assert [t["replica_index"] for t in sh.topology()] == [0, 1]
        assert sh.replicas.urls == urls
    with StatehouseClient(urls[:1]) as sh, pytest.raises(LayoutError) as missing:
        sh.topology()
    assert str(missing.value).endswith(
        "has 2 replicas (topology version 1), but no URL given is replica 1: add its URL (or set "
        "STATEHOUSE_REPLICA_URLS on the replicas, so that one URL is enough)"
    )

    storage = {"STATEHOUSE_CHECKPOINT_DIR": two_replicas[0].settings["STATEHOUSE_CHECKPOINT_DIR"]}
    twin = start_server(tmp_path / "twin", replica(0, 2, **storage))  # the same set, index 0 again
    other = start_server(tmp_path / "other", replica(1, 2))  # its own checkpoint storage: another set
    try:
        with StatehouseClient([urls[0], twin.url]) as sh, pytest.raises(LayoutError) as twice:
            sh.topology()
        assert f"{urls[0]} and {twin.url} are both replica 0: give each replica's URL once" in str(twice.value)
        with StatehouseClient([urls[0], other.url]) as sh, pytest.raises(LayoutError) as mixed:
            sh.topology()
        assert "the URLs are replicas of different replica sets" in str(mixed.value)
    finally:
        twin.stop()
        other.stop()


def test_a_rescale_brings_new_and_adopting_replicas_to_one_version(tmp_path):
    """STATEHOUSE_TOPOLOGY_VERSION: an empty data directory records it, an adopting one too; a
    directory recorded at an older version (a removed replica's volume) is refused unless adopted."""
    new = start_server(tmp_path / "new", replica(1, 2, STATEHOUSE_TOPOLOGY_VERSION="3"))
    try:
        assert topology(new)["version"] == 3
    finally:
        new.stop()
    server = start_server(tmp_path, replica(0, 1))
    server.stop()
    code, lines = run_refused(tmp_path, replica(0, 1, STATEHOUSE_TOPOLOGY_VERSION="3"))
    assert (
        code == 2 and "holds replica 0 of 1 at topology version 1, older than STATEHOUSE_TOPOLOGY_VERSION=3" in lines[0]
    )
    code, lines = run_refused(tmp_path, replica(0, 2, STATEHOUSE_ADOPT_TOPOLOGY="1", STATEHOUSE_TOPOLOGY_VERSION="1"))
    assert code == 2 and "adopting another layout needs a higher version" in lines[0]
    server = start_server(tmp_path, replica(0, 2, STATEHOUSE_ADOPT_TOPOLOGY="1", STATEHOUSE_TOPOLOGY_VERSION="3"))
    try:
        assert (topology(server)["version"], topology(server)["replica_count"]) == (3, 2)
    finally:
        server.stop()
    code, lines = run_refused(tmp_path, replica(0, 2, STATEHOUSE_TOPOLOGY_VERSION="2"))
    assert code == 2 and "holds topology version 3, newer than STATEHOUSE_TOPOLOGY_VERSION=2" in lines[0]


def test_replica_urls_expand_from_a_template_or_list_each_replica(monkeypatch):
    from pydantic import ValidationError

    from statehouse.app.settings import Settings

    for name in [k for k in os.environ if k.upper().startswith("STATEHOUSE_")]:
        monkeypatch.delenv(name)
    template = Settings(replica_count=3, replica_urls="http://sh-{index}.sh-headless:8000")
    assert template.replica_url_list == tuple(f"http://sh-{i}.sh-headless:8000" for i in range(3))
    listed = Settings(replica_count=2, replica_urls="http://a:1/, http://b:2")
    assert listed.replica_url_list == ("http://a:1", "http://b:2")
    assert Settings().replica_url_list == ()
    for value, message in [
        ("http://a:1,http://b:2", "lists 2 URLs for STATEHOUSE_REPLICA_COUNT=3 replicas: list each one"),
        (
            "http://a-{index}:1,http://b:2,http://c:3",
            "give one URL template with {index}, or a list of URLs without it",
        ),
        ("a-{index}:8000", "'a-0:8000' is not http(s)://host[:port]"),
    ]:
        with pytest.raises(ValidationError, match=re.escape(f"STATEHOUSE_REPLICA_URLS={value!r}: {message}")):
            Settings(replica_count=3, replica_urls=value)
