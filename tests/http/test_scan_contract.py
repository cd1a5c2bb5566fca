"""The scan route and its published schema agree on the `key` parameter: one `key=...` is one key
whatever it spells (a query string carries text), the parameter repeated is several, and more
keys than the route takes are refused 422. Both backends, auth on, over real HTTP."""

from __future__ import annotations

import httpx
import jsonschema
import pyarrow as pa
import pytest

from tests.support.server import start_server

pytestmark = [pytest.mark.http]

TOKEN = "scan-token"
PATH = "/v1/jobs/{job}/states/{state}/scan"


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    env = {"STATEHOUSE_BACKEND": "rocksdb", "STATEHOUSE_API_TOKENS": TOKEN}
    server = start_server(tmp_path_factory.mktemp("scan"), env)
    try:
        headers = {"authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
            client.put("/v1/jobs/j", json={"max_parallelism": 128}).raise_for_status()
            client.put("/v1/jobs/j/states/r", json={"kind": "reducing", "function": "sum"}).raise_for_status()
            for key in ("false", "7", "alice"):
                client.post(f"/v1/jobs/j/states/r/keys/{key}/add", json={"value": 1}).raise_for_status()
            yield client
    finally:
        server.stop()
    assert "Traceback" not in server.log()


def query_schema(http: httpx.Client) -> dict:
    """The scan's query parameters as one JSON Schema object, as the published document says."""
    operation = http.get("/openapi.json").json()["paths"][PATH]["get"]
    query = [p for p in operation["parameters"] if p["in"] == "query"]
    return {
        "type": "object",
        "properties": {p["name"]: p["schema"] for p in query},
        "required": [p["name"] for p in query if p.get("required")],
    }


def rows(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return sorted(pa.ipc.open_stream(response.content).read_all().column("key").to_pylist())


def test_one_key_that_spells_another_type_is_accepted_and_documented(http):
    # The request schemathesis took for a boolean: `key=false` is the key "false".
    answer = http.get("/v1/jobs/j/states/r/scan", params={"key": "false", "limit": 9305})
    assert rows(answer) == ["false"]
    schema = query_schema(http)
    jsonschema.validate({"key": "false", "limit": 9305}, schema)  # one key: a string
    jsonschema.validate({"key": ["false", "7"], "limit": 1}, schema)  # several: an array
    assert rows(http.get("/v1/jobs/j/states/r/scan", params=[("key", "false"), ("key", "7")])) == ["7", "false"]
    # What the document forbids, the route refuses.
    for params in ({"key": "x", "limit": 100_001}, {"key": "x", "limit": 0}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(params, schema)
        refused = http.get("/v1/jobs/j/states/r/scan", params=params)
        assert refused.status_code == 422, refused.text


def test_more_keys_than_a_scan_takes_are_refused(http):
    refused = http.get("/v1/jobs/j/states/r/scan", params=[("key", str(i)) for i in range(1001)])
    assert refused.status_code == 422 and refused.json()["code"] == "invalid_argument", refused.text
    assert "at most 1000 keys" in refused.json()["detail"]
