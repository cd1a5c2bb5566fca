"""Per-job tokens over real HTTP: a token reaches only the jobs in its scopes (403 `forbidden`,
nothing changed), the job listing shows only those, undecodable Authorization headers are a
401, and restore locations stay inside the checkpoint storage unless an @admin token restores
from a location the operator allowed."""

from __future__ import annotations

import os
import shutil
import time

import httpx
import pyarrow as pa
import pytest

from tests.support.process_memory import peak_growth
from tests.support.raw_http import HUGE, status_before_the_body
from tests.support.server import start_server

pytestmark = [pytest.mark.http]

ADMIN, ALL, JOB_A = "admin-token", "every-job-token", "job-a-token"
FROM_FILE = "file-token-of-b"
ARROW = "application/vnd.apache.arrow.stream"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("scopes")
    token_file = root / "tokens"
    token_file.write_text(f"# one entry per line, as in STATEHOUSE_API_TOKENS\n\n{FROM_FILE}:b+c\n")
    (root / "archive").mkdir()
    env = {
        "STATEHOUSE_BACKEND": "heap",
        "STATEHOUSE_API_TOKENS": f"{JOB_A}:a, {ALL}, {ADMIN}:@admin",
        "STATEHOUSE_API_TOKENS_FILE": str(token_file),
        "STATEHOUSE_RESTORE_LOCATIONS": str(root / "archive"),
    }
    server = start_server(root / "server", env)
    server.checkpoints = root / "server" / "checkpoints"
    server.archive = root / "archive"
    yield server
    server.stop()
    assert "Traceback" not in server.log()


def client(server, token: str | None) -> httpx.Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.url + "/v1", headers=headers, timeout=20)


@pytest.fixture(scope="module")
def admin(server):
    with client(server, ADMIN) as c:
        for job in ("a", "b"):
            c.put(f"/jobs/{job}", json={"max_parallelism": 128}).raise_for_status()
            c.put(f"/jobs/{job}/states/v", json={"kind": "value"}).raise_for_status()
            c.put(f"/jobs/{job}/states/m", json={"kind": "map"}).raise_for_status()
            c.put(f"/jobs/{job}/states/v/keys/k", json={"value": f"{job}-1"}).raise_for_status()
            c.put(f"/jobs/{job}/states/m/keys/k/entries/e", json={"value": 1}).raise_for_status()
            c.put(f"/jobs/{job}/operators/o/subtasks/0/lists/l", json={"value": [1]}).raise_for_status()
            c.put(f"/jobs/{job}/operators/o/broadcast/bc/entries/x", json={"value": 1}).raise_for_status()
        yield c


@pytest.fixture(scope="module")
def job_a(server):
    with client(server, JOB_A) as c:
        yield c


def assert_forbidden(response: httpx.Response) -> None:
    assert response.status_code == 403, (response.request.method, response.request.url, response.text)
    problem = response.json()
    assert problem["code"] == "forbidden" and problem["type"] == "/problems/forbidden"
    assert "not scoped to job" in problem["detail"] or "may not read" in problem["detail"]


def complete(http: httpx.Client, job: str, checkpoint_id: int, kind: str = "savepoint") -> dict:
    assert http.post(f"/jobs/{job}/checkpoints", json={"checkpoint_id": checkpoint_id, "kind": kind}).status_code == 202
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = http.post(f"/jobs/{job}/checkpoints/{checkpoint_id}/complete")
        if done.status_code != 409 or done.json()["code"] != "checkpoint_not_ready":
            break
        time.sleep(0.05)
    assert done.status_code == 200, done.text
    return done.json()


def view(admin: httpx.Client, job: str) -> dict:
    """What a job holds, as its admin sees it (to show a refused request changed nothing)."""
    info = admin.get(f"/jobs/{job}").json()
    return {
        "job": {k: info[k] for k in ("max_parallelism", "states", "epoch", "committed_epoch")},
        "states": admin.get(f"/jobs/{job}/states").json(),
        "v": admin.get(f"/jobs/{job}/states/v/keys/k").json(),
        "m": admin.get(f"/jobs/{job}/states/m/keys/k/entries").json(),
        "list": admin.get(f"/jobs/{job}/operators/o/subtasks/0/lists/l").json(),
        "broadcast": admin.get(f"/jobs/{job}/operators/o/broadcast/bc/entries").json(),
        "checkpoints": admin.get(f"/jobs/{job}/checkpoints").json(),
        "epoch": admin.get(f"/jobs/{job}/epochs/1").json(),
    }


def arrow(**columns) -> bytes:
    sink = pa.BufferOutputStream()
    table = pa.table(columns)
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def every_family(job: str) -> list[tuple[str, str, dict]]:
    """One request of each endpoint family on ``job``, valid apart from the token."""
    base = f"/jobs/{job}"
    keyed = f"{base}/states/v/keys/k"
    entry = f"{base}/states/m/keys/k/entries/e"
    operator_list = f"{base}/operators/o/subtasks/0/lists/l"
    broadcast = f"{base}/operators/o/broadcast/bc/entries"
    attempts = {"json": {"attempts": []}}
    put_ops = {"json": {"ops": [{"op": "put", "state": "v", "key": "k", "value": "stolen"}]}}
    columns_body = {"content": arrow(key=["k"], value=["stolen"]), "headers": {"content-type": ARROW}}
    octets = {"content": b"stolen", "headers": {"content-type": "application/octet-stream"}}
    msgpack = {"content-type": "application/msgpack"}
    return [
        # jobs
        ("GET", base, {}),
        ("PUT", base, {"json": {}}),
        ("DELETE", base, {}),
        ("POST", f"{base}/fence", {"json": {"epoch": 7}}),
        ("GET", f"{base}/states", {}),
        ("PUT", f"{base}/states/new", {"json": {"kind": "value"}}),
        ("GET", f"{base}/states/v", {}),
        ("DELETE", f"{base}/states/v", {}),
        # keyed
        ("GET", keyed, {}),
        ("PUT", keyed, {"json": {"value": "stolen"}}),
        ("DELETE", keyed, {}),
        ("GET", f"{base}/states/v/keys", {}),
        ("GET", entry, {}),
        ("PUT", entry, {"json": {"value": 99}}),
        ("DELETE", entry, {}),
        ("GET", f"{base}/states/m/keys/k/entries", {}),
        # batch and columns
        ("POST", f"{base}/batch", put_ops),
        ("POST", f"{base}/batch", {"json": {"ops": [{"op": "get", "state": "v", "key": "k"}]}}),
        ("POST", f"{base}/states/v/columns/put", columns_body),
        ("POST", f"{base}/states/v/columns/get", {"content": arrow(key=["k"]), "headers": {"content-type": ARROW}}),
        # operators
        ("GET", operator_list, {}),
        ("PUT", operator_list, {"json": {"value": [2]}}),
        ("POST", operator_list, {"json": {"value": 3}}),
        ("DELETE", operator_list, {}),
        ("GET", broadcast, {}),
        ("GET", f"{broadcast}/x", {}),
        ("PUT", f"{broadcast}/x", {"json": {"value": 2}}),
        ("DELETE", f"{broadcast}/x", {}),
        # raw state, keyed (per key group) and operator (per subtask)
        ("GET", f"{base}/raw/key-groups/0", {}),
        ("PUT", f"{base}/raw/key-groups/0", octets),
        ("POST", f"{base}/raw/key-groups/0/append", octets),
        ("DELETE", f"{base}/raw/key-groups/0", {}),
        ("GET", f"{base}/operators/o/subtasks/0/raw", {}),
        ("POST", f"{base}/operators/o/subtasks/0/raw/partitions", octets),
        ("PUT", f"{base}/operators/o/subtasks/0/raw", {"content": b"\x81\xaapartitions\x90", "headers": msgpack}),
        ("DELETE", f"{base}/operators/o/subtasks/0/raw", {}),
        # checkpoints and restore
        ("POST", f"{base}/checkpoints", {"json": {"checkpoint_id": 50}}),
        ("GET", f"{base}/checkpoints", {}),
        ("GET", f"{base}/checkpoints/1", {}),
        ("POST", f"{base}/checkpoints/1/complete", {}),
        ("POST", f"{base}/checkpoints/1/abort", {}),
        ("POST", f"{base}/restore", {"json": {}}),
        ("POST", f"{base}/restore", {"json": {"checkpoint_id": 1}}),
        # epochs
        ("GET", f"{base}/epochs/1", {}),
        ("POST", f"{base}/epochs/1/prepare", attempts),
        ("POST", f"{base}/epochs/1/commit", attempts),
        ("POST", f"{base}/epochs/1/abort", {}),
    ]


def test_a_token_reaches_only_its_jobs_and_a_refusal_changes_nothing(server, admin, job_a):
    complete(admin, "b", 1, kind="checkpoint")
    before = view(admin, "b")
    for method, path, kwargs in every_family("b"):
        assert_forbidden(job_a.request(method, path, **kwargs))
    assert view(admin, "b") == before
    # the same requests on its own job get through (a few, to show the token itself works)
    assert job_a.get("/jobs/a/states/v/keys/k").json() == {"value": "a-1"}
    assert job_a.post("/jobs/a/batch", json={"ops": [{"op": "get", "state": "v", "key": "k"}]}).status_code == 200
    assert job_a.get("/jobs/a/operators/o/subtasks/0/lists/l").status_code == 200
    raw = {"content": b"own", "headers": {"content-type": "application/octet-stream"}}
    assert job_a.put("/jobs/a/raw/key-groups/0", **raw).status_code == 204  # raw state: the job's scope, as keyed
    assert job_a.get("/jobs/a/raw/key-groups/0").content == b"own"


def test_a_refusal_says_nothing_about_whether_the_job_exists(job_a, admin):
    for job in ("b", "no-such-job"):
        assert_forbidden(job_a.get(f"/jobs/{job}"))
    assert_forbidden(job_a.put("/jobs/z", json={"max_parallelism": 128}))  # creating needs the scope too
    assert admin.get("/jobs/z").status_code == 404
    created = job_a.put("/jobs/a", json={"max_parallelism": 128})
    assert created.status_code == 200


def test_the_listing_shows_the_tokens_jobs(server, admin, job_a):
    admin.put("/jobs/c").raise_for_status()
    try:
        listed = {}
        for token in (ADMIN, ALL, JOB_A, FROM_FILE):
            with client(server, token) as http:
                pages, cursor = [], None
                while True:  # paging stays correct when jobs are skipped
                    page = http.get("/jobs", params={"limit": 1, **({"cursor": cursor} if cursor else {})}).json()
                    pages += [j["job"] for j in page["items"]]
                    cursor = page["next_cursor"]
                    if cursor is None:
                        break
                listed[token] = pages
        assert listed == {ADMIN: ["a", "b", "c"], ALL: ["a", "b", "c"], JOB_A: ["a"], FROM_FILE: ["b", "c"]}
    finally:
        admin.delete("/jobs/c")


def test_missing_wrong_and_undecodable_tokens_are_401_and_the_connection_lives_on(server):
    with httpx.Client(base_url=server.url + "/v1", timeout=10, limits=httpx.Limits(max_connections=1)) as http:
        for authorization in (
            None,
            b"Bearer wrong",
            b"Bearer",
            b"Basic " + JOB_A.encode(),
            "Bearer t\u00f6ken".encode(),
            b"Bearer \xff\xfe",
            b"Bearer " + JOB_A.encode() + b"\xe9",
            "Bearer \u00e9".encode("latin-1"),
        ):
            headers = {"authorization": authorization} if authorization is not None else {}
            refused = http.get("/jobs/a", headers=headers)
            assert refused.status_code == 401, (authorization, refused.text)
            assert refused.json()["code"] == "unauthorized" and refused.headers["www-authenticate"] == "Bearer"
            # the same connection still answers
            assert http.get("/jobs/a", headers={"authorization": f"Bearer {JOB_A}"}).status_code == 200
        assert http.get("/jobs/a", headers={"authorization": f"bearer   {JOB_A}"}).status_code == 200
    assert "Traceback" not in server.log()


def test_restore_reads_the_checkpoint_storage_of_the_tokens_jobs(server, admin, job_a):
    own = complete(job_a, "a", 10)
    other = complete(admin, "b", 11)
    job_a.put("/jobs/a/states/v/keys/k", json={"value": "a-2"}).raise_for_status()
    restored = job_a.post("/jobs/a/restore", json={"location": own["location"]})
    assert restored.status_code == 200, restored.text
    assert job_a.get("/jobs/a/states/v/keys/k").json() == {"value": "a-1"}

    # another job's snapshot, however it is spelled, is that job's state: refused
    job_a.put("/jobs/a/states/v/keys/k", json={"value": "a-3"}).raise_for_status()
    checkpoints = str(server.checkpoints)
    link = server.checkpoints / "a" / "link-to-b"
    os.symlink(other["location"], link)
    try:
        for location in (
            other["location"],
            f"{own['location']}/../../../b/savepoints/sp-11",
            f"file://{other['location']}",
            str(link),
            checkpoints,  # the root holds every job
        ):
            assert_forbidden(job_a.post("/jobs/a/restore", json={"location": location}))
        assert job_a.get("/jobs/a/states/v/keys/k").json() == {"value": "a-3"}
        # a token of every job may restore one job's savepoint into another
        with client(server, ALL) as every_job:
            assert every_job.post("/jobs/a/restore", json={"location": str(link)}).status_code == 200
        assert job_a.get("/jobs/a/states/v/keys/k").json() == {"value": "b-1"}
    finally:
        link.unlink()


def test_restore_from_elsewhere_needs_an_admin_token_and_an_allowed_location(server, admin, job_a, tmp_path):
    expected = admin.get("/jobs/a/states/v/keys/k").json()
    savepoint = complete(admin, "a", 20)
    archived = server.archive / "a-sp-20"
    shutil.copytree(savepoint["location"], archived)
    admin.put("/jobs/a/states/v/keys/k", json={"value": "changed"}).raise_for_status()
    for token in (JOB_A, ALL):
        with client(server, token) as http:
            refused = http.post("/jobs/a/restore", json={"location": str(archived)})
            assert refused.status_code == 403 and refused.json()["code"] == "forbidden", refused.text
            assert "@admin" in refused.json()["detail"]
    assert admin.get("/jobs/a/states/v/keys/k").json() == {"value": "changed"}
    for location in (str(archived), f"file://{archived}", f"{archived}/../{archived.name}"):
        restored = admin.post("/jobs/a/restore", json={"location": location})
        assert restored.status_code == 200, restored.text
        assert restored.json()["location"] == os.path.realpath(archived)
        assert admin.get("/jobs/a/states/v/keys/k").json() == expected
        admin.put("/jobs/a/states/v/keys/k", json={"value": "changed"}).raise_for_status()

    # outside both the checkpoint storage and the allowed locations: nobody, not even an admin
    outside = tmp_path / "elsewhere"
    shutil.copytree(savepoint["location"], outside)
    escape = server.archive / "escape"
    os.symlink(outside, escape)
    try:
        for location in (
            str(outside),
            f"{archived}/../../{outside.parent.name}/{outside.name}",
            f"{server.checkpoints}/a/../../..",
            str(escape),
            "/etc",
            "s3://some-bucket/a",
            "s3://some-bucket/../other",
            "memory://x/y",
            f"file://{archived}?x=1",
        ):
            for token in (ADMIN, JOB_A):
                with client(server, token) as http:
                    refused = http.post("/jobs/a/restore", json={"location": location})
                assert refused.status_code == 400, (location, refused.text)
                assert refused.json()["code"] == "invalid_location"
    finally:
        escape.unlink()


def test_the_python_client_sends_its_token_and_raises_forbidden(server, admin):
    from statehouse.client import Forbidden, StatehouseClient, Unauthorized

    with StatehouseClient([server.url], token=JOB_A) as sh:
        assert sh.job("a").value_state("v").get("k") is not None
        with pytest.raises(Forbidden) as info:
            sh.job("b").value_state("v").get("k")
        assert info.value.status == 403 and info.value.code == "forbidden"
        with pytest.raises(Forbidden):
            sh.create_job("z", 128)
    with StatehouseClient([server.url], token="wrong") as sh, pytest.raises(Unauthorized):
        sh.job("a").value_state("v").get("k")


def test_bucket_locations_are_normalized_before_they_are_compared():
    """The same rules on S3 checkpoint storage (a real boto3 client, never contacted: nothing is read)."""
    from statehouse.snapshots.errors import InvalidLocation
    from statehouse.snapshots.storage.locations import RestoreLocations
    from statehouse.snapshots.storage.s3 import S3Storage

    storage = S3Storage("state", "/statehouse/prod/", endpoint_url="http://127.0.0.1:9")
    policy = RestoreLocations(storage, allowed=("s3://archive/keep",))
    inside = {
        "s3://state/statehouse/prod/orders/chk-3": ("s3://state/statehouse/prod/orders/chk-3", "orders"),
        "s3://state/statehouse/prod/orders/../clicks/chk-3/": ("s3://state/statehouse/prod/clicks/chk-3", "clicks"),
        "s3://state//statehouse//prod/./orders": ("s3://state/statehouse/prod/orders", "orders"),
        "s3://state/statehouse/prod": ("s3://state/statehouse/prod", ""),
        "s3://archive/keep/sp-1": ("s3://archive/keep/sp-1", None),
        "s3://archive/keep/x/../sp-2": ("s3://archive/keep/sp-2", None),
    }
    for location, (url, job) in inside.items():
        resolved = policy.resolve(location)
        assert (resolved.url, resolved.job) == (url, job), location
    for location in (
        "s3://state/statehouse/prod/../other/orders",
        "s3://state/statehouse/production/orders",
        "s3://state/statehouse/prod/orders/../../../../x",
        "s3://other-bucket/statehouse/prod/orders",
        "s3://user@state/statehouse/prod/orders",
        "s3://state/statehouse/prod/orders?versionId=1",
        "s3://state/statehouse/prod/orders#x",
        "s3://[state/statehouse/prod",
        "s3:///statehouse/prod",
        "s3://archive/keepsake",
        "s3://archive/keep/../../etc",
        "/statehouse/prod/orders",
        "http://state/statehouse/prod/orders",
        "",
    ):
        with pytest.raises(InvalidLocation):
            policy.resolve(location)


# -- the token is checked before a byte of the body is received (app/intake.py) ----------------

BODY_ROUTES = [
    ("PUT", "/v1/jobs/a/states/v/keys/k", "application/json"),  # a model body
    ("POST", "/v1/jobs/a/batch", "application/msgpack"),
    ("POST", "/v1/jobs/a/states/v/columns/put", ARROW),
]


@pytest.mark.parametrize(("method", "path", "media"), BODY_ROUTES, ids=["model", "batch", "columns"])
def test_a_token_is_refused_before_the_body_is_received(server, admin, method, path, media):
    assert status_before_the_body(server.url, method, path, {"content-type": media}) == 401
    wrong_job = {"content-type": media, "authorization": f"Bearer {FROM_FILE}"}  # scoped to b and c
    assert status_before_the_body(server.url, method, path, wrong_job) == 403
    # Then, with the right token, the type (415), and only then the size (413): all before the body.
    token = {"authorization": f"Bearer {JOB_A}"}
    assert status_before_the_body(server.url, method, path, {"content-type": media}, HUGE + 1) == 401
    assert status_before_the_body(server.url, method, path, {**token, "content-type": "text/plain"}, HUGE + 1) == 415
    assert status_before_the_body(server.url, method, path, {**token, "content-type": media}, HUGE + 1) == 413


def test_a_64_mib_body_without_a_token_costs_the_server_nothing(server, admin):
    """64 MiB of {"value": [{}, {}, ...]} without a token is refused before it is decoded: decoded,
    it would be 22 million dicts, 1.5 GB of RSS and 3.5 s of the event loop before its 401."""
    body = b'{"value": [' + b"{}, " * ((HUGE - 16) // 4) + b"{}]}"
    assert len(body) <= HUGE
    with peak_growth(server.process.pid) as grown:
        refused = httpx.put(
            server.url + "/v1/jobs/a/states/v/keys/k",
            content=body,
            headers={"content-type": "application/json"},
            timeout=60,
        )
    assert refused.status_code == 401, refused.text
    assert grown["peak"] < 32 << 20, grown


def test_the_routes_behind_a_token_are_exactly_those_under_v1():
    """app/intake.py authenticates every path under /v1 before the body, and require_token hands
    routes the grant found there: a route behind require_token elsewhere would have none."""
    from fastapi import routing

    from statehouse.app.dependencies import require_token
    from statehouse.app.intake import API_PREFIX
    from statehouse.app.main import create_app
    from statehouse.app.settings import Settings

    for context in routing.iter_route_contexts(create_app(Settings()).routes):
        route = context.original_route
        if not isinstance(route, routing.APIRoute):
            continue
        secured = any(d.call is require_token for d in context.dependant.dependencies)  # as included
        assert secured == (context.path + "/").startswith(API_PREFIX + "/"), context.path
