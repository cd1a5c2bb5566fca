"""Schemathesis fuzzes the running service against its own /openapi.json: on RocksDB (the
production default; the contract does not depend on the backend), auth on and off. Every
response must be declared (status, media type, schema) and none may be a 5xx.

Few examples per operation keep this quick. A longer run:
``STATEHOUSE_FUZZ_EXAMPLES=500 pytest tests/http/test_schemathesis.py`` (``STATEHOUSE_FUZZ_SEED`` picks
another seed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.server import REPO, start_server

pytestmark = [pytest.mark.http, pytest.mark.slow]

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
EXAMPLES = int(os.environ.get("STATEHOUSE_FUZZ_EXAMPLES", "10"))
SEED = int(os.environ.get("STATEHOUSE_FUZZ_SEED", "20261123"))
TOKEN = "fuzz-token"
# Every check schemathesis has but one: positive_data_acceptance expects 2xx for any schema-valid
# request, but the engine refuses, with a documented 4xx code, what no JSON Schema can say: a value
# of the wrong type for a typed state, a name taken by a state of another kind, `value` and `values`
# together, integers written 8.0 (JSON Schema's "integer" admits them; the API keeps one form).
CHECKS = "all"
EXCLUDED_CHECKS = ["positive_data_acceptance"]
# With auth off the server takes requests without the bearer token the contract declares, which these
# checks count as accepting a request that breaks the schema (they run with auth on).
AUTH_OFF_EXCLUDED = ["ignored_auth", "missing_required_header", "negative_data_rejection"]
# Deleting the job or its states first would leave the rest of the run with 404s: they run last.
DESTRUCTIVE = ("deleteJob", "deleteState")
# A live rescale's steps (auth off: anyone is @admin) freeze the job, after which its writes answer
# 503 rescale_in_progress, as they must: they run after everything else, alone.
RESCALE = (
    "prepareRescale",
    "catchUpRescale",
    "loadRescale",
    "decideRescale",
    "getRescaleDecision",
    "commitRescale",
    "abortRescale",
)

JOB = "fuzz"
STATES = {
    "v": {"kind": "value"},
    "l": {"kind": "list"},
    "m": {"kind": "map"},
    "r": {"kind": "reducing", "function": "sum"},
    "a": {"kind": "aggregating", "function": "avg"},
    "n": {"kind": "value", "key_type": "long"},
    "t": {"kind": "value", "ttl": {"ttl_ms": 60000}},
}
# Most generated names are the job and states above, so that requests get past the lookups;
# the rest stay random.
CONFIG = f"""
[dictionaries.jobs]
values = ["{JOB}"]
[dictionaries.states]
values = [{", ".join(f'"{s}"' for s in STATES)}]

[parameters]
"path.job" = {{ dictionary = "jobs", probability = 0.8 }}
"path.state" = {{ dictionary = "states", probability = 0.8 }}
"body.ops[*].state" = {{ dictionary = "states", probability = 0.8 }}
"""


# With a token, as deployments run; without one (every operation open) in make test-long.
@pytest.fixture(scope="module", params=[pytest.param("auth-off", marks=pytest.mark.long), "auth-on"])
def target(request, tmp_path_factory):
    """A fresh server with the fuzz job and one state of each kind; the token when auth is on."""
    token = TOKEN if request.param == "auth-on" else None
    env = {"STATEHOUSE_BACKEND": "rocksdb", **({"STATEHOUSE_API_TOKENS": token} if token else {})}
    server = start_server(tmp_path_factory.mktemp(f"fuzz-{request.param}"), env)
    try:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        with httpx.Client(base_url=server.url + "/v1", headers=headers, timeout=10) as http:
            assert http.put(f"/jobs/{JOB}", json={"max_parallelism": 128}).status_code == 201
            for name, descriptor in STATES.items():
                assert http.put(f"/jobs/{JOB}/states/{name}", json=descriptor).status_code == 201
        yield server, token
    finally:
        server.stop()


def fuzz(server, workdir: Path, token: str | None, *options: str, examples: int = EXAMPLES) -> str:
    """Run the schemathesis CLI against ``server``; its output. Fails the test on any failure."""
    config = workdir / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [str(SCHEMATHESIS), "--config-file", str(config), "run", server.url + "/openapi.json"]
    excluded = EXCLUDED_CHECKS + ([] if token else AUTH_OFF_EXCLUDED)
    command += ["--checks", CHECKS, "--exclude-checks", ",".join(excluded)]
    command += ["--max-examples", str(examples), "--seed", str(SEED), "--workers", "1"]
    command += ["--generation-database", "none", "--no-color", *options]
    if token:
        command += ["--header", f"Authorization: Bearer {token}"]
    # cwd: schemathesis may leave reports behind; not in the repository. The hooks make Arrow bodies.
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.support.schemathesis_hooks", "PYTHONPATH": str(REPO)}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=workdir, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-20000:] + "\n--- server log ---\n" + server.log()[-5000:]
    counts = re.search(r"(\d+) generated, (\d+) passed\b", output)
    assert counts and counts[1] == counts[2], output[-20000:]  # every generated case passed
    print(f"schemathesis {server.settings.get('STATEHOUSE_BACKEND')}: {counts[0]}")  # seen with pytest -s
    return output


def test_every_response_is_declared_and_no_server_error(target, tmp_path):
    server, token = target
    excluded = [option for operation in DESTRUCTIVE + RESCALE for option in ("--exclude-operation-id", operation)]
    fuzz(server, tmp_path, token, *excluded)
    for last in (DESTRUCTIVE, RESCALE):
        included = [option for operation in last for option in ("--include-operation-id", operation)]
        fuzz(server, tmp_path, token, *included, examples=max(5, EXAMPLES // 5))
    assert "Traceback" not in server.log()


def test_without_a_token_every_v1_operation_answers_a_declared_401(tmp_path):
    server = start_server(tmp_path / "server", {"STATEHOUSE_BACKEND": "rocksdb", "STATEHOUSE_API_TOKENS": TOKEN})
    try:
        fuzz(server, tmp_path, None, "--phases", "fuzzing", examples=3)
        # The access log: every /v1 call was refused. 405: the coverage phase also tries undeclared
        # methods; 400 and 422: a body that is not JSON (or holds a number beyond 64 bits), or a path
        # that is not UTF-8, is refused while it is read, before auth runs (it reveals no state).
        statuses = set(re.findall(r'"[A-Z]+ /v1[/?]\S* HTTP/1.1" (\d+) ', server.log()))
        assert {"401"} <= statuses <= {"400", "401", "405", "422"}, statuses
    finally:
        server.stop()
