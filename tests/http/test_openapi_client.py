"""/openapi.json is the contract: a client generated from it with openapi-python-client drives a
whole session against real servers, its three columnar functions (and docs/api.md's example of
them) send Arrow streams, and every error parses into its typed ``Problem``.

Also here: the document's own promises (operation ids, Problem everywhere, security, media
types) and that each problem ``type`` resolves to an anchor of docs/api.md.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
import msgpack
import pyarrow as pa
import pytest

from statehouse.app.openapi import OPERATION_IDS
from statehouse.app.problems import STATUS_BY_CODE
from statehouse.protocol.keygroups import KeyGroupRange, assign_to_key_group
from tests.support.docs_blocks import check_output, parse_page
from tests.support.server import REPO, start_server

pytestmark = [pytest.mark.http]

ARROW = "application/vnd.apache.arrow.stream"
PACKAGE = "statehouse_client"  # the generated package's import name, the default docs/api.md imports
GENERATOR = Path(sys.executable).with_name("openapi-python-client")
TOKEN = "generated-client-token"
MIRROR = "https://docs.internal.example/statehouse/api.html"  # STATEHOUSE_PROBLEM_DOCS_URL of `guarded`
MAX_VALUE_BYTES = 1000
MAX_BODY_BYTES = 100_000


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """Auth on, small limits and a docs mirror for problem types."""
    server = start_server(
        tmp_path_factory.mktemp("openapi-guarded"),
        {
            "STATEHOUSE_BACKEND": "heap",
            "STATEHOUSE_API_TOKENS": TOKEN,
            "STATEHOUSE_MAX_VALUE_BYTES": str(MAX_VALUE_BYTES),
            "STATEHOUSE_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
            "STATEHOUSE_PROBLEM_DOCS_URL": MIRROR,
        },
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def spec(guarded) -> dict:
    return httpx.get(guarded.url + "/openapi.json", timeout=10).json()


@pytest.fixture(scope="module")
def gen(spec, tmp_path_factory):
    """The client openapi-python-client generates from the served document (no warning allowed),
    imported: ``gen.<operation id in snake_case>`` is its module, ``gen.m`` the models."""
    work = tmp_path_factory.mktemp("openapi-client")
    (work / "openapi.json").write_text(json.dumps(spec))
    # The generator knows binary bodies as application/octet-stream only; msgpack and Arrow are two.
    (work / "config.yaml").write_text(
        "post_hooks: []\ncontent_type_overrides:\n  application/msgpack: application/octet-stream\n"
        "  application/vnd.apache.arrow.stream: application/octet-stream\n"
    )
    output = work / "out" / PACKAGE
    command = [str(GENERATOR), "generate", "--path", str(work / "openapi.json"), "--output-path", str(output)]
    command += ["--meta", "none", "--config", str(work / "config.yaml"), "--fail-on-warning"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=work)
    assert result.returncode == 0, result.stdout + result.stderr
    sys.path.insert(0, str(output.parent))
    try:
        modules = {
            path.stem: importlib.import_module(f"{PACKAGE}.api.{path.parent.name}.{path.stem}")
            for path in sorted((output / "api").glob("*/*.py"))
            if path.stem != "__init__"
        }
        yield SimpleNamespace(
            **modules,
            m=importlib.import_module(f"{PACKAGE}.models"),
            types=importlib.import_module(f"{PACKAGE}.types"),
            package=importlib.import_module(PACKAGE),
            path=output.parent,
        )
    finally:
        sys.path.remove(str(output.parent))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def snake(operation_id: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", operation_id).lower()


def ok(response, status: int = 200):
    assert response.status_code == status, response.content
    return response.parsed


def problem(gen, response, status: int, code: str, docs_url: str | None = None):
    """The generated client parsed the error into its typed Problem, with the right code and type
    (the service's own page of the code, or its anchor at ``docs_url`` when that setting is set)."""
    assert response.status_code == status, response.content
    parsed = response.parsed
    assert isinstance(parsed, gen.m.Problem), response.content
    assert (parsed.status, parsed.code) == (status, code)
    assert parsed.type_ == (f"/problems/{code}" if docs_url is None else f"{docs_url}#{code}")
    assert parsed.title and parsed.detail
    return parsed


def client(gen, url: str, **headers: str):
    return gen.package.Client(base_url=url, raise_on_unexpected_status=True, timeout=httpx.Timeout(30), headers=headers)


# -- a whole session through the generated client ----------------------------------------------


@pytest.mark.slow
def test_generated_client_drives_a_whole_session(gen, server, job_name):
    m = gen.m
    c = client(gen, server.url)
    job = ok(gen.put_job.sync_detailed(job_name, client=c, body=m.JobBody(max_parallelism=128)), 201)
    assert isinstance(job, m.JobInfo) and job.key_group_range == [0, 127] and job.max_parallelism == 128
    assert ok(gen.put_job.sync_detailed(job_name, client=c)).job == job_name  # confirms: 200
    assert ok(gen.get_job.sync_detailed(job_name, client=c)).states == []
    listed = ok(gen.list_jobs.sync_detailed(client=c, limit=1000))
    assert job_name in [j.job for j in listed.items]

    kinds = {
        "v": m.DescriptorBody(kind=m.DescriptorBodyKind.VALUE),
        "l": m.DescriptorBody(kind=m.DescriptorBodyKind.LIST),
        "m": m.DescriptorBody(kind=m.DescriptorBodyKind.MAP),
        "r": m.DescriptorBody(kind=m.DescriptorBodyKind.REDUCING, function="sum"),
        "a": m.DescriptorBody(kind=m.DescriptorBodyKind.AGGREGATING, function="avg"),
    }
    for name, body in kinds.items():
        registered = ok(gen.put_state.sync_detailed(job_name, name, client=c, body=body), 201)
        assert (registered.name, registered.kind) == (name, str(body.kind))
    assert [d.name for d in ok(gen.list_states.sync_detailed(job_name, client=c)).items] == sorted(kinds)
    assert ok(gen.get_state.sync_detailed(job_name, "r", client=c)).function == "sum"

    def read(state: str, key: str = "alice"):
        return ok(gen.get_keyed_value.sync_detailed(job_name, state, key, client=c)).value

    # value
    ok(
        gen.put_keyed_value.sync_detailed(job_name, "v", "alice", client=c, body=m.ValueBody(value={"item": "book"})),
        204,
    )
    assert read("v") == {"item": "book"}
    # list
    ok(gen.put_keyed_value.sync_detailed(job_name, "l", "alice", client=c, body=m.ValueBody(value=[1, 2])), 204)
    ok(gen.add_to_keyed_value.sync_detailed(job_name, "l", "alice", client=c, body=m.AddBody(values=[3, 4])), 204)
    ok(gen.add_to_keyed_value.sync_detailed(job_name, "l", "alice", client=c, body=m.AddBody(value=5)), 204)
    assert read("l") == [1, 2, 3, 4, 5]
    # map
    for user_key, value in (("book", 1), ("pen", 2)):
        body = m.ValueBody(value=value)
        ok(gen.put_map_entry.sync_detailed(job_name, "m", "alice", user_key, client=c, body=body), 204)
    assert ok(gen.get_map_entry.sync_detailed(job_name, "m", "alice", "pen", client=c)).value == 2
    entries = ok(gen.list_map_entries.sync_detailed(job_name, "m", "alice", client=c))
    assert [(e.key, e.value) for e in entries.items] == [("book", 1), ("pen", 2)] and entries.next_cursor is None
    ok(gen.remove_map_entry.sync_detailed(job_name, "m", "alice", "pen", client=c), 204)
    assert read("m") == {"book": 1}
    # reducing and aggregating
    for value in (2, 3):
        ok(gen.add_to_keyed_value.sync_detailed(job_name, "r", "alice", client=c, body=m.AddBody(value=value)), 204)
        ok(gen.add_to_keyed_value.sync_detailed(job_name, "a", "alice", client=c, body=m.AddBody(value=value * 2)), 204)
    assert read("r") == 5 and read("a") == 5.0
    # keys, clear
    keys = ok(gen.list_keys.sync_detailed(job_name, "v", client=c))
    assert [(k.key, k.ns) for k in keys.items] == [("alice", "")]
    ok(gen.clear_keyed_value.sync_detailed(job_name, "v", "alice", client=c), 204)
    problem(gen, gen.get_keyed_value.sync_detailed(job_name, "v", "alice", client=c), 404, "key_not_found")

    # the batch endpoint, JSON
    ops = [
        m.BatchOp(op=m.BatchOpOp.PUT, state="v", key="bob", value={"item": "pen"}),
        m.BatchOp(op=m.BatchOpOp.ADD, state="r", key="bob", value=7, ns="2026-11-23"),
        m.BatchOp(op=m.BatchOpOp.MAP_PUT, state="m", key="bob", user_key="cup", value=1),
        m.BatchOp(op=m.BatchOpOp.GET, state="v", key="bob"),
        m.BatchOp(op=m.BatchOpOp.GET, state="r", key="bob", ns="2026-11-23"),
        m.BatchOp(op=m.BatchOpOp.MAP_CONTAINS, state="m", key="bob", user_key="cup"),
        m.BatchOp(op=m.BatchOpOp.GET, state="v", key="nobody"),
    ]
    results = ok(gen.apply_batch.sync_detailed(job_name, client=c, body=m.BatchRequest(ops=ops))).results
    assert [r.to_dict() for r in results] == [
        {},
        {},
        {},
        {"value": {"item": "pen"}},
        {"value": 7},
        {"value": True},
        {"value": None},
    ]
    # ... and msgpack: the generated client sends a File as application/msgpack
    packed = msgpack.packb({"ops": [{"op": "put", "state": "v", "key": "carol", "value": b"\x00\xff"}]})
    file = gen.types.File(payload=packed, mime_type="application/msgpack")
    as_json = c.with_headers({"Accept": "application/json"})
    assert ok(gen.apply_batch.sync_detailed(job_name, client=as_json, body=file)).results[0].to_dict() == {}
    assert read("v", "carol") == "AP8="  # bytes come back base64-encoded through JSON

    # a checkpoint: trigger, list, get, complete
    info = ok(gen.trigger_checkpoint.sync_detailed(job_name, client=c, body=m.TriggerBody(checkpoint_id=1)), 202)
    assert info.checkpoint_id == 1 and str(info.kind) == "checkpoint" and len(info.key_group_range) == 2
    page = ok(gen.list_checkpoints.sync_detailed(job_name, client=c))
    assert [i.checkpoint_id for i in page.items] == [1] and page.next_checkpoint_id == 2
    assert ok(gen.get_checkpoint.sync_detailed(job_name, 1, client=c)).checkpoint_id == 1
    completed = ok(gen.complete_checkpoint.sync_detailed(job_name, 1, client=c))
    assert str(completed.status) == "completed"
    problem(gen, gen.get_checkpoint.sync_detailed(job_name, 99, client=c), 404, "checkpoint_not_found")
    problem(
        gen,
        gen.trigger_checkpoint.sync_detailed(job_name, client=c, body=m.TriggerBody(checkpoint_id=1)),
        409,
        "checkpoint_conflict",
    )

    # errors, each parsed into the typed Problem
    problem(gen, gen.get_job.sync_detailed(job_name + "-missing", client=c), 404, "job_not_found")
    problem(gen, gen.get_keyed_value.sync_detailed(job_name, "nope", "alice", client=c), 404, "state_not_found")
    problem(
        gen, gen.put_job.sync_detailed(job_name, client=c, body=m.JobBody(max_parallelism=256)), 409, "job_conflict"
    )
    problem(
        gen,
        gen.add_to_keyed_value.sync_detailed(job_name, "v", "alice", client=c, body=m.AddBody(value=1)),
        409,
        "wrong_state_kind",
    )
    stale = m.BatchRequest(ops=[m.BatchOp(op=m.BatchOpOp.PUT, state="v", key="bob", value=1)], epoch=5)
    assert problem(gen, gen.apply_batch.sync_detailed(job_name, client=c, body=stale), 409, "stale_epoch").epoch == 0
    invalid = problem(
        gen, gen.put_job.sync_detailed("other", client=c, body=m.JobBody(max_parallelism=0)), 422, "validation_error"
    )
    assert [(e.loc, e.type_) for e in invalid.errors] == [(["body", "max_parallelism"], "greater_than_equal")]
    problem(gen, gen.get_job.sync_detailed("bad$name", client=c), 422, "invalid_name")
    failing = m.BatchRequest(
        ops=[
            m.BatchOp(op=m.BatchOpOp.GET, state="v", key="bob"),
            m.BatchOp(op=m.BatchOpOp.ADD, state="v", key="bob", value=1),
        ]
    )
    assert (
        problem(gen, gen.apply_batch.sync_detailed(job_name, client=c, body=failing), 409, "wrong_state_kind").op_index
        == 1
    )

    ok(gen.delete_state.sync_detailed(job_name, "a", client=c), 204)
    ok(gen.delete_job.sync_detailed(job_name, client=c), 204)
    problem(gen, gen.get_job.sync_detailed(job_name, client=c), 404, "job_not_found")


def arrow_file(gen, **columns: pa.Array):
    """One record batch of ``columns`` as an Arrow IPC stream, the ``File`` body a generated
    columnar function sends (with the Arrow media type its config maps onto octet-stream)."""
    batch = pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return gen.types.File(payload=sink.getvalue().to_pybytes(), mime_type=ARROW)


def arrow_read(c, kwargs: dict) -> pa.Table:
    """Send the request a generated columnar function builds (its ``_get_kwargs``) and read the
    Arrow answer: its parser reads only the JSON answer of a write."""
    response = c.get_httpx_client().request(**kwargs)
    assert response.status_code == 200 and response.headers["content-type"] == ARROW, response.content
    return pa.ipc.open_stream(response.content).read_all()


def test_generated_client_has_the_three_columnar_functions(gen, server, job_name):
    m = gen.m
    c = client(gen, server.url)
    ok(gen.put_job.sync_detailed(job_name, client=c, body=m.JobBody(max_parallelism=128)), 201)
    for name, value_type in (
        ("spent", m.DescriptorBodyValueTypeType0.FLOAT64),
        ("n", m.DescriptorBodyValueTypeType0.INT64),
    ):
        body = m.DescriptorBody(kind=m.DescriptorBodyKind.REDUCING, function="sum", value_type=value_type)
        ok(gen.put_state.sync_detailed(job_name, name, client=c, body=body), 201)
    keys = pa.array(["alice", "bob", "alice"])

    def stored(state: str, key: str):
        return ok(gen.get_keyed_value.sync_detailed(job_name, state, key, client=c)).value

    # one state: POST .../states/{state}/columns/{op}
    file = arrow_file(gen, key=keys, value=pa.array([2.5, 1.0, 0.5]))
    added = ok(gen.apply_columns.sync_detailed(job_name, "spent", m.ApplyColumnsOp.ADD, client=c, body=file))
    assert isinstance(added, m.ColumnsResponse) and (added.op, added.rows, added.staged) == ("add", 3, False)
    assert (stored("spent", "alice"), stored("spent", "bob")) == (3.0, 1.0)
    read = gen.apply_columns._get_kwargs(job_name, "spent", m.ApplyColumnsOp.GET, body=arrow_file(gen, key=keys))
    assert arrow_read(c, read).column("value").to_pylist() == [3.0, 1.0, 3.0]

    # several states: POST .../columns/{op}?states=
    file = arrow_file(gen, key=keys, **{"value:spent": pa.array([1.0, 2.0, 3.0]), "value:n": pa.array([1, 1, 1])})
    added = ok(
        gen.apply_states_columns.sync_detailed(
            job_name, m.ApplyStatesColumnsOp.ADD, client=c, body=file, states="spent,n"
        )
    )
    assert (added.op, added.rows, added.staged) == ("add", 6, False)  # rows times states
    assert [stored(s, k) for s in ("spent", "n") for k in ("alice", "bob")] == [7.0, 3.0, 2, 1]

    # timers: POST .../timers/{domain}/columns/{op}
    file = arrow_file(gen, key=pa.array(["alice", "bob"]), timestamp=pa.array([1_000, 2_000], pa.int64()))
    domain = m.ApplyTimerColumnsDomain.EVENT
    registered = ok(
        gen.apply_timer_columns.sync_detailed(job_name, domain, m.ApplyTimerColumnsOp.REGISTER, client=c, body=file)
    )
    assert (registered.op, registered.rows, registered.staged) == ("register", 2, False)
    timers = ok(gen.list_timers.sync_detailed(job_name, m.ListTimersDomain.EVENT, client=c)).items
    assert sorted((t.key, t.timestamp, t.ns) for t in timers) == [("alice", 1_000, ""), ("bob", 2_000, "")]

    ok(gen.delete_job.sync_detailed(job_name, client=c), 204)


def test_the_documented_columnar_example_runs(gen, server, job_name):
    """docs/api.md's generated-client example of the columnar endpoint, run as written against
    the session server (its address and job name replaced), printing what the page shows."""
    [block] = [b for b in parse_page(REPO / "docs" / "api.md") if "apply_columns" in b.code]
    code = block.code.replace("http://localhost:8000", server.url).replace("arrow-demo", job_name)
    env = {**os.environ, "PYTHONPATH": str(gen.path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    check_output(block, result.stdout)
    c = client(gen, server.url)
    assert ok(gen.get_keyed_value.sync_detailed(job_name, "spent", "alice", client=c)).value == 3.0
    ok(gen.delete_job.sync_detailed(job_name, client=c), 204)


def test_key_of_another_replica_is_a_typed_421(gen, two_replicas, job_name):
    m = gen.m
    replica0 = client(gen, two_replicas[0].url)
    ok(gen.put_job.sync_detailed(job_name, client=replica0, body=m.JobBody(max_parallelism=128)), 201)
    value_state = m.DescriptorBody(kind=m.DescriptorBodyKind.VALUE)
    ok(gen.put_state.sync_detailed(job_name, "v", client=replica0, body=value_state), 201)
    owned = KeyGroupRange.for_operator(128, 2, 0)
    theirs = next(f"k{i}" for i in range(1000) if assign_to_key_group(f"k{i}", "string", 128) not in owned)
    response = gen.put_keyed_value.sync_detailed(job_name, "v", theirs, client=replica0, body=m.ValueBody(value=1))
    refused = problem(gen, response, 421, "key_not_owned")
    assert refused.owner == 1 and refused.key_group == assign_to_key_group(theirs, "string", 128)
    ok(gen.delete_job.sync_detailed(job_name, client=replica0), 204)


def test_auth_a_value_limit_and_the_problem_docs_setting(gen, guarded):
    m = gen.m
    anonymous = client(gen, guarded.url)
    problem(gen, gen.list_jobs.sync_detailed(client=anonymous), 401, "unauthorized", MIRROR)
    problem(
        gen,
        gen.get_job.sync_detailed("g", client=client(gen, guarded.url, Authorization="Bearer wrong")),
        401,
        "unauthorized",
        MIRROR,
    )
    assert ok(gen.get_health.sync_detailed(client=anonymous)).status == "ok"  # probes stay open
    ready = ok(gen.get_readiness.sync_detailed(client=anonymous))
    assert (str(ready.backend), ready.replica_count) == ("heap", 1)
    assert "statehouse_http_requests_total" in ok(gen.get_metrics.sync_detailed(client=anonymous))

    authed = gen.package.AuthenticatedClient(base_url=guarded.url, token=TOKEN, raise_on_unexpected_status=True)
    ok(gen.put_job.sync_detailed("g", client=authed, body=m.JobBody(max_parallelism=64)), 201)
    ok(
        gen.put_state.sync_detailed("g", "v", client=authed, body=m.DescriptorBody(kind=m.DescriptorBodyKind.VALUE)),
        201,
    )
    ok(gen.put_keyed_value.sync_detailed("g", "v", "k", client=authed, body=m.ValueBody(value="x" * 100)), 204)
    big = m.ValueBody(value="x" * (MAX_VALUE_BYTES + 1))
    problem(
        gen, gen.put_keyed_value.sync_detailed("g", "v", "k", client=authed, body=big), 413, "value_too_large", MIRROR
    )
    assert ok(gen.get_keyed_value.sync_detailed("g", "v", "k", client=authed)).value == "x" * 100  # unchanged
    problem(gen, gen.get_keyed_value.sync_detailed("g", "v", "absent", client=authed), 404, "key_not_found", MIRROR)


# -- the document itself ------------------------------------------------------------------------


def operations(spec: dict):
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def test_operation_ids_are_short_stable_and_from_the_table(spec):
    ids = {(path, method): op["operationId"] for path, method, op in operations(spec)}
    assert sorted(ids.values()) == sorted(OPERATION_IDS.values())  # one per operation, none left over
    assert all(re.fullmatch(r"[a-z]+(?:[A-Z][a-z]+)*", i) for i in ids.values()), ids
    assert ids[("/v1/jobs/{job}", "put")] == "putJob"
    assert ids[("/v1/jobs/{job}/states/{state}/keys/{key}", "get")] == "getKeyedValue"
    assert ids[("/v1/jobs/{job}/states/{state}/keys/{key}", "put")] == "putKeyedValue"
    assert ids[("/v1/jobs/{job}/batch", "post")] == "applyBatch"


def test_every_error_is_the_problem_schema_and_v1_is_secured(spec):
    schemas = spec["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    problem_schema = schemas["Problem"]
    assert set(problem_schema["required"]) == {"type", "title", "status", "code", "detail"}
    assert {"instance", "op_index", "owner", "key_group", "epoch", "errors"} <= set(problem_schema["properties"])
    bearer = spec["components"]["securitySchemes"]["bearerAuth"]
    assert (bearer["type"], bearer["scheme"]) == ("http", "bearer")
    for path, method, op in operations(spec):
        assert (op.get("security") == [{"bearerAuth": []}]) == path.startswith("/v1"), (path, method)
        for status, response in op["responses"].items():
            if int(status) >= 400:
                assert response["content"] == {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
                }, (path, method, status)
                codes = response["x-problem-codes"]
                assert codes and all(STATUS_BY_CODE[c] == int(status) for c in codes), (path, method, status)
        if path.startswith("/v1"):
            assert {"401", "422", "503"} <= set(op["responses"]), (path, method)
            assert "WWW-Authenticate" in op["responses"]["401"]["headers"]
    assert "prefixItems" not in json.dumps(spec)


def declared(spec, path, method) -> dict[str, list[str]]:
    responses = spec["paths"][path][method]["responses"]
    return {status: r["x-problem-codes"] for status, r in responses.items() if "x-problem-codes" in r}


def test_operations_declare_what_they_answer(spec):
    put_value = declared(spec, "/v1/jobs/{job}/states/{state}/keys/{key}", "put")
    assert {"job_not_found", "state_not_found"} <= set(put_value["404"])
    assert put_value["409"] == ["layout_mismatch", "wrong_state_kind"]
    assert {"key_too_large", "value_too_large", "body_too_large"} <= set(put_value["413"])
    assert put_value["421"] == ["key_not_owned"] and "validation_error" in put_value["422"]
    assert "key_not_found" in declared(spec, "/v1/jobs/{job}/states/{state}/keys/{key}", "get")["404"]
    batch = declared(spec, "/v1/jobs/{job}/batch", "post")
    assert {"stale_epoch", "wrong_state_kind"} <= set(batch["409"]) and batch["415"] == ["unsupported_media_type"]
    assert "batch_too_large" in batch["413"] and batch["400"] == ["malformed_body"]
    complete = declared(spec, "/v1/jobs/{job}/checkpoints/{checkpoint_id}/complete", "post")
    assert {"checkpoint_not_ready", "checkpoint_failed"} <= set(complete["409"])
    assert "storage_unavailable" in complete["503"] and "not_ready" in complete["503"]
    assert declared(spec, "/readyz", "get") == {"503": ["not_ready"]}


def test_media_types_and_shapes(spec):
    paths, schemas = spec["paths"], spec["components"]["schemas"]
    binary = {"type": "string", "format": "binary", "contentMediaType": "application/msgpack"}
    batch = paths["/v1/jobs/{job}/batch"]["post"]
    assert batch["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/BatchRequest"
    }
    assert batch["requestBody"]["content"]["application/msgpack"]["schema"] == binary
    assert set(batch["responses"]["200"]["content"]) == {"application/json", "application/msgpack"}
    for path in (
        "/v1/jobs/{job}/states/{state}/keys/{key}",
        "/v1/jobs/{job}/states/{state}/keys/{key}/entries/{user_key}",
    ):
        assert paths[path]["get"]["responses"]["200"]["content"]["application/msgpack"]["schema"] == binary
    assert paths["/metrics"]["get"]["responses"]["200"]["content"] == {"text/plain": {"schema": {"type": "string"}}}
    assert paths["/healthz"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/Health"
    )
    assert paths["/readyz"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/Readiness"
    )
    for model in ("JobInfo", "CheckpointInfoModel", "RestoreInfoModel"):
        kg_range = schemas[model]["properties"]["key_group_range"]
        assert (kg_range["type"], kg_range["items"], kg_range["minItems"], kg_range["maxItems"]) == (
            "array",
            {"type": "integer"},
            2,
            2,
        )


def test_msgpack_value_reads_answer_as_declared(server, job_name):
    with httpx.Client(base_url=server.url + "/v1", timeout=10) as http:
        http.put(f"/jobs/{job_name}")
        http.put(f"/jobs/{job_name}/states/v", json={"kind": "value"})
        http.put(f"/jobs/{job_name}/states/v/keys/k", json={"value": [1, "two"]})
        r = http.get(f"/jobs/{job_name}/states/v/keys/k", headers={"accept": "application/msgpack"})
        assert r.headers["content-type"] == "application/msgpack"
        assert msgpack.unpackb(r.content) == {"value": [1, "two"]}
        http.delete(f"/jobs/{job_name}")


# -- problem types: the service's own page of each code ----------------------------------------


def test_every_code_has_its_anchor_in_the_problem_codes_table():
    text = (REPO / "app" / "problems.md").read_text()
    anchors = re.findall(r'<a id="([a-z_]+)"></a>', text)
    assert len(anchors) == len(set(anchors)), "an anchor appears twice"
    missing = (set(STATUS_BY_CODE) | {"internal_error"}) - set(anchors)
    assert not missing, f"app/problems.md has no anchor for {sorted(missing)}"
    for code, status in STATUS_BY_CODE.items():  # each entry states the code's status
        row = next(line for line in text.splitlines() if f'<a id="{code}"></a>' in line)
        assert f"| {status} |" in row, row


def test_problem_type_is_the_services_page_or_the_docs_url_and_the_code(server, guarded):
    default = httpx.get(server.url + "/v1/jobs/no-such-job", timeout=10).json()
    assert default["type"] == "/problems/job_not_found"
    page = httpx.get(server.url + default["type"], timeout=10)  # resolved against the answering replica
    assert page.status_code == 200 and "<code>job_not_found</code>" in page.text
    too_big = httpx.put(
        guarded.url + "/v1/jobs/x",
        content=b" " * (MAX_BODY_BYTES + 1),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        timeout=10,
    )
    assert too_big.status_code == 413 and too_big.json()["type"] == MIRROR + "#body_too_large"  # from middleware
    assert httpx.get(guarded.url + "/v1/jobs", timeout=10).json()["type"] == MIRROR + "#unauthorized"
