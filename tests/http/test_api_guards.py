"""Bad input, ownership, auth and limits over real HTTP: each refused with the right 4xx
problem+json, and nothing changed."""

import httpx
import msgpack
import pytest

from statehouse.protocol.keygroups import KeyGroupRange, assign_to_key_group
from tests.support.server import start_server

pytestmark = [pytest.mark.http]

TOKEN = "s3cret-token"
LIMITS = {
    "STATEHOUSE_MAX_VALUE_BYTES": "1000",
    "STATEHOUSE_MAX_KEY_BYTES": "64",
    "STATEHOUSE_MAX_BATCH_OPS": "50",
    "STATEHOUSE_MAX_BODY_BYTES": "100000",
}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """Replica 1 of 2, auth on, small limits."""
    env = {
        "STATEHOUSE_BACKEND": "rocksdb",
        "STATEHOUSE_REPLICA_INDEX": "1",
        "STATEHOUSE_REPLICA_COUNT": "2",
        "STATEHOUSE_API_TOKENS": f"other-token, {TOKEN}",
        **LIMITS,
    }
    server = start_server(tmp_path_factory.mktemp("guarded"), env)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(guarded):
    with httpx.Client(base_url=guarded.url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=10) as c:
        c.put("/v1/jobs/g", json={"max_parallelism": 128})
        c.put("/v1/jobs/g/states/v", json={"kind": "value"})
        c.put("/v1/jobs/g/states/l", json={"kind": "list"})
        c.put("/v1/jobs/g/states/s", json={"kind": "reducing", "function": "sum"})
        c.put("/v1/jobs/g/states/n", json={"kind": "value", "key_type": "int"})
        c.put("/v1/jobs/g/states/m", json={"kind": "map"})
        yield c


OWNED = KeyGroupRange.for_operator(128, 2, 1)
MINE = next(f"k{i}" for i in range(1000) if assign_to_key_group(f"k{i}", "string", 128) in OWNED)
THEIRS = next(f"k{i}" for i in range(1000) if assign_to_key_group(f"k{i}", "string", 128) not in OWNED)


def assert_problem(response, status, code):
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status and body["code"] == code
    assert body["type"].endswith(code) and body["detail"]
    return body


def snapshot(client):
    """Everything a bad request could have touched."""
    return client.post(
        "/v1/jobs/g/batch",
        json={"ops": [{"op": "get", "state": s, "key": MINE} for s in ("v", "l", "s")]},
    ).json()


def test_a_key_too_large_names_its_setting(client):
    body = assert_problem(client.put(f"/v1/jobs/g/states/v/keys/{'k' * 100}", json={"value": 1}), 413, "key_too_large")
    assert body["detail"].endswith("(STATEHOUSE_MAX_KEY_BYTES)"), body["detail"]


def test_key_of_another_replica_is_refused_with_the_owner(client):
    r = client.put(f"/v1/jobs/g/states/v/keys/{THEIRS}", json={"value": 1})
    body = assert_problem(r, 421, "key_not_owned")
    assert body["owner"] == 0 and body["key_group"] == assign_to_key_group(THEIRS, "string", 128)
    r = client.post("/v1/jobs/g/batch", json={"ops": [{"op": "put", "state": "v", "key": MINE, "value": 1},
                                                       {"op": "get", "state": "v", "key": THEIRS}]})  # fmt: skip
    assert assert_problem(r, 421, "key_not_owned")["op_index"] == 1
    assert client.get(f"/v1/jobs/g/states/v/keys/{MINE}").status_code == 404  # op 0 was not applied
    assert client.get("/v1/jobs/g").json()["key_group_range"] == [64, 127]


def test_auth(guarded):
    with httpx.Client(base_url=guarded.url, timeout=10) as anonymous:
        r = anonymous.get("/v1/jobs")
        assert_problem(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        assert_problem(anonymous.get("/v1/jobs", headers={"authorization": "Bearer wrong"}), 401, "unauthorized")
        assert_problem(anonymous.put("/v1/jobs/x", headers={"authorization": "Basic abc"}), 401, "unauthorized")
        assert anonymous.get("/v1/jobs", headers={"authorization": "Bearer other-token"}).status_code == 200
        for open_path in ("/healthz", "/readyz", "/metrics"):
            assert anonymous.get(open_path).status_code == 200


BIG = "x" * 2000
BAD_REQUESTS = [
    # (method, path, kwargs, status, code)
    ("put", "/v1/jobs/bad$name", {}, 422, "invalid_name"),
    ("put", "/v1/jobs/g", {"json": {"max_parallelism": 256}}, 409, "job_conflict"),
    ("put", "/v1/jobs/new-job", {"json": {"max_parallelism": 0}}, 422, "validation_error"),
    ("put", "/v1/jobs/new-job", {"json": {"max_parallelism": "many"}}, 422, "validation_error"),
    ("put", "/v1/jobs/new-job", {"content": b"{not json", "headers": {"content-type": "application/json"}}, 400,
     "malformed_body"),
    ("get", "/v1/jobs/nope", {}, 404, "job_not_found"),
    ("put", "/v1/jobs/g/states/v", {"json": {"kind": "list"}}, 409, "incompatible_state"),
    ("put", "/v1/jobs/g/states/x", {"json": {"kind": "tree"}}, 422, "validation_error"),
    ("put", "/v1/jobs/g/states/x", {"json": {"kind": "reducing"}}, 422, "invalid_argument"),
    ("put", "/v1/jobs/g/states/x", {"json": {"kind": "reducing", "function": "exec"}}, 422, "invalid_argument"),
    ("put", "/v1/jobs/g/states/x", {"json": {"kind": "value", "ttl": {"ttl_ms": 0}}}, 422, "validation_error"),
    ("put", "/v1/jobs/g/states/x", {"json": {"kind": "value", "extra": 1}}, 422, "validation_error"),
    ("get", "/v1/jobs/g/states/missing/keys/a", {}, 404, "state_not_found"),
    ("put", f"/v1/jobs/g/states/v/keys/{MINE}", {"json": {"nothing": 1}}, 422, "validation_error"),
    ("put", f"/v1/jobs/g/states/v/keys/{MINE}", {"json": {"value": BIG}}, 413, "value_too_large"),
    ("put", f"/v1/jobs/g/states/v/keys/{'k' * 100}", {"json": {"value": 1}}, 413, "key_too_large"),
    ("put", f"/v1/jobs/g/states/s/keys/{MINE}", {"json": {"value": 1}}, 409, "wrong_state_kind"),
    ("post", f"/v1/jobs/g/states/s/keys/{MINE}/add", {"json": {"value": "x"}}, 422, "invalid_value"),
    ("post", f"/v1/jobs/g/states/l/keys/{MINE}/add", {"json": {"value": 1, "values": [2]}}, 422, "validation_error"),
    ("post", f"/v1/jobs/g/states/l/keys/{MINE}/add", {"json": {"value": None}}, 422, "invalid_value"),
    ("put", f"/v1/jobs/g/states/l/keys/{MINE}", {"json": {"value": "not a list"}}, 422, "invalid_argument"),
    ("get", f"/v1/jobs/g/states/v/keys/{MINE}/entries/u", {}, 409, "wrong_state_kind"),
    ("get", "/v1/jobs/g/states/n/keys/abc", {}, 422, "invalid_key"),
    ("get", "/v1/jobs/g/states/n/keys/99999999999", {}, 422, "invalid_key"),
    ("get", "/v1/jobs/g/states/v/keys", {"params": {"cursor": "%%%"}}, 422, "invalid_argument"),
    ("get", "/v1/jobs/g/states/v/keys", {"params": {"key_group": 3}}, 421, "key_not_owned"),
    ("get", "/v1/jobs/g/states/v/keys", {"params": {"key_group": 500}}, 422, "invalid_argument"),
    ("post", "/v1/jobs/g/batch", {"content": b"\xc1", "headers": {"content-type": "application/msgpack"}}, 400,
     "malformed_body"),
    ("post", "/v1/jobs/g/batch", {"content": b"{", "headers": {"content-type": "application/json"}}, 400,
     "malformed_body"),
    ("post", "/v1/jobs/g/batch", {"content": b"<ops/>", "headers": {"content-type": "text/xml"}}, 415,
     "unsupported_media_type"),
    ("post", "/v1/jobs/g/batch", {"json": [1, 2]}, 422, "invalid_argument"),
    ("post", "/v1/jobs/g/batch", {"json": {"ops": [{"op": "get", "state": "v", "key": MINE}] * 51}}, 413,
     "batch_too_large"),
    ("post", "/v1/jobs/g/batch", {"json": {"ops": [{"op": "put", "state": "v", "key": MINE, "value": "y" * 990}] * 50
                                           + [{"op": "nope"}] * 0}}, 200, None),
    ("post", "/v1/jobs/g/batch", {"content": b"{" + b" " * 200_000 + b"}", "headers": {"content-type":
                                  "application/json"}}, 413, "body_too_large"),
    ("post", "/v1/jobs/g/batch", {"json": {"ops": [{"op": "explode", "state": "v", "key": MINE}]}}, 422,
     "invalid_argument"),
    ("post", "/v1/jobs/g/batch", {"json": {"ops": [{"op": "get", "state": "v"}]}}, 422, "invalid_argument"),
    ("post", "/v1/jobs/g/batch", {"json": {"ops": ["get"]}}, 422, "invalid_argument"),
    ("post", "/v1/jobs/g/batch", {"json": {"ops": [{"op": "get", "state": "v", "key": MINE, "ns": 5}]}}, 422,
     "invalid_argument"),
    ("post", "/v1/jobs/g/batch", {"json": {"ops": [{"op": "get", "state": "n", "key": "x"}]}}, 422, "invalid_key"),
    ("post", "/v1/jobs/g/batch", {"json": {"ops": [{"op": "map_put", "state": "v", "key": MINE, "user_key": "a",
                                                    "value": 1}]}}, 409, "wrong_state_kind"),
    ("put", "/v1/jobs/g/operators/op/subtasks/-1/lists/x", {"json": {"value": [1]}}, 422, "validation_error"),
    ("put", "/v1/jobs/g/operators/op/subtasks/0/lists/x", {"json": {"value": 1}}, 422, "invalid_argument"),
    ("put", "/v1/jobs/g/operators/op/subtasks/0/lists/x", {"json": {"value": [1]}, "params": {"mode": "rr"}}, 422,
     "validation_error"),
    ("put", "/v1/jobs/g/operators/op/broadcast/b/entries/k", {"json": {"value": None}}, 422, "invalid_value"),
    ("delete", "/v1/jobs/g/nothing-here", {}, 404, "not_found"),
    ("patch", "/v1/jobs/g", {}, 405, "method_not_allowed"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "code"), BAD_REQUESTS)
def test_bad_input_gets_a_clear_problem_and_changes_nothing(client, method, path, kwargs, status, code):
    before = snapshot(client)
    jobs_before = client.get("/v1/jobs").json()
    response = client.request(method.upper(), path, **kwargs)
    if code is None:  # the largest valid batch passes
        assert response.status_code == status, response.text
        client.delete(f"/v1/jobs/g/states/v/keys/{MINE}")
    else:
        assert_problem(response, status, code)
    assert snapshot(client) == before
    assert client.get("/v1/jobs").json() == jobs_before


def test_values_that_cannot_be_stored_are_refused(client):
    before = snapshot(client)
    r = client.put(f"/v1/jobs/g/states/v/keys/{MINE}", content=b'{"value": 1180591620717411303424}',
                   headers={"content-type": "application/json"})  # fmt: skip
    assert_problem(r, 422, "invalid_value")  # beyond 64-bit integers
    body = msgpack.packb({"ops": [{"op": "map_get", "state": "m", "key": MINE, "user_key": 5}]})
    r = client.post("/v1/jobs/g/batch", content=body, headers={"content-type": "application/msgpack"})
    assert_problem(r, 422, "invalid_argument")
    assert snapshot(client) == before


def test_metrics_count_requests_ops_and_errors(client, guarded):
    client.post("/v1/jobs/g/batch", json={"ops": [{"op": "get", "state": "v", "key": MINE}] * 3})
    client.get("/v1/jobs/g/states/missing/keys/a")
    text = httpx.get(guarded.url + "/metrics").text
    assert 'statehouse_http_requests_total{method="POST",route="/v1/jobs/{job}/batch",status="200"}' in text
    assert 'statehouse_state_operations_total{kind="value",op="get"}' in text
    assert 'statehouse_errors_total{code="state_not_found"}' in text
    assert "statehouse_http_request_duration_seconds_bucket" in text


def test_openapi_documents_every_route_and_model(guarded):
    spec = httpx.get(guarded.url + "/openapi.json").json()
    paths = spec["paths"]
    for path in [
        "/v1/jobs/{job}",
        "/v1/jobs",
        "/v1/jobs/{job}/states/{state}",
        "/v1/jobs/{job}/states/{state}/keys/{key}",
        "/v1/jobs/{job}/states/{state}/keys/{key}/add",
        "/v1/jobs/{job}/states/{state}/keys/{key}/entries/{user_key}",
        "/v1/jobs/{job}/states/{state}/keys/{key}/entries",
        "/v1/jobs/{job}/states/{state}/keys",
        "/v1/jobs/{job}/batch",
        "/v1/jobs/{job}/operators/{operator}/subtasks/{index}/lists/{name}",
        "/v1/jobs/{job}/operators/{operator}/broadcast/{name}/entries/{key}",
    ]:
        assert path in paths, path
    body = paths["/v1/jobs/{job}/batch"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "application/msgpack"}
    assert {"BatchRequest", "BatchOp", "DescriptorBody", "TtlBody"} <= set(spec["components"]["schemas"])
    assert httpx.get(guarded.url + "/docs").status_code == 200
