"""The first hour: what cost a new user a round trip or misled them, each pinned by a test.

The hints (a 4xx detail says what was wrong and what to send instead), the documented restore
command failing visibly, the client wheel's documented size, and a Spark job written from
docs/spark.md alone running first time against real replicas. The settings' failures are in
tests/operations/test_settings.py; every documented block runs in tests/operations/test_docs_blocks.py.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
import zipfile
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from statehouse.client import StatehouseClient
from tests.support.server import REPO
from tests.support.spark import jvm_options

pytestmark = [pytest.mark.http]

SPARK_DOC = REPO / "docs/spark.md"


def problem(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.json()["code"] == code, response.text
    return response.json()["detail"]


# -- hints -------------------------------------------------------------------------------


def test_a_number_for_ttl_says_to_send_ttl_ms(http, job_name):
    http.put(f"/jobs/{job_name}", json={}).raise_for_status()
    detail = problem(
        http.put(f"/jobs/{job_name}/states/recent", json={"kind": "list", "ttl": 60000}), 422, "validation_error"
    )
    assert detail == 'body.ttl: ttl is an object, not a number: send "ttl": {"ttl_ms": 60000}'
    # what the hint says to send works
    http.put(f"/jobs/{job_name}/states/recent", json={"kind": "list", "ttl": {"ttl_ms": 60000}}).raise_for_status()


def test_avg_on_a_reducing_state_says_to_use_an_aggregating_state(http, job_name):
    http.put(f"/jobs/{job_name}", json={}).raise_for_status()
    detail = problem(
        http.put(f"/jobs/{job_name}/states/mean", json={"kind": "reducing", "function": "avg"}), 422, "invalid_argument"
    )
    assert detail.endswith('register an aggregating state, {"kind": "aggregating", "function": "avg"}'), detail
    http.put(f"/jobs/{job_name}/states/mean", json={"kind": "aggregating", "function": "avg"}).raise_for_status()


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        (
            {"op": "add", "state": "spent"},
            "op 0: missing 'key': 'add' on state 'spent' needs the key it reads or writes",
        ),
        (
            {"op": "put", "state": "spent", "key": "k"},
            "op 0: missing 'value': 'put' takes the value to write (add and map_add also take 'values', a list)",
        ),
        (
            {"op": "register_timer", "key": "k"},
            "op 0: missing 'timestamp': register_timer needs the timer's time, in milliseconds",
        ),
        (
            {"op": "register_timer", "timestamp": 5},
            "op 0: missing 'key': register_timer needs the key the timer belongs to",
        ),
    ],
)
def test_a_batch_operation_missing_a_field_says_what_it_is_for(http, job_name, op, expected):
    http.put(f"/jobs/{job_name}", json={}).raise_for_status()
    http.put(f"/jobs/{job_name}/states/spent", json={"kind": "value"}).raise_for_status()
    assert problem(http.post(f"/jobs/{job_name}/batch", json={"ops": [op]}), 422, "invalid_argument") == expected


def test_an_operator_list_that_is_not_a_list_shows_one(http, job_name):
    http.put(f"/jobs/{job_name}", json={}).raise_for_status()
    response = http.put(f"/jobs/{job_name}/operators/src/subtasks/0/lists/offsets", json={"value": 5})
    detail = problem(response, 422, "invalid_argument")
    assert detail == """'value' must be a list (the subtask's whole list, e.g. {"value": [1, 2]}); got int"""


# -- docs/spark.md's restore command ------------------------------------------------------


def documented_restore_command() -> str:
    text = SPARK_DOC.read_text()
    (command,) = re.findall(r"^ *(curl [^\n]*/restore\"[^\n]*\\\n[^\n]*)$", text, re.M)
    return command


def test_the_documented_restore_command_restores_and_fails_visibly(server):
    """It used to send no content type: a 422 that `curl -sf` hid (exit 22, no output)."""
    job = httpx.Client(base_url=f"{server.url}/v1/jobs/features", timeout=10)
    httpx.put(f"{server.url}/v1/jobs/features", json={}, timeout=10).raise_for_status()
    job.put("/states/total_spent", json={"kind": "reducing", "function": "sum"}).raise_for_status()
    job.post("/states/total_spent/keys/u1/add", json={"value": 1}).raise_for_status()
    if job.get("/checkpoints/42").status_code == 404:  # the session's server may have run this on the other backend
        job.post("/checkpoints", json={"checkpoint_id": 42}).raise_for_status()
        while job.get("/checkpoints/42").json()["status"] != "uploaded":
            time.sleep(0.05)
        job.post("/checkpoints/42/complete").raise_for_status()
    job.post("/states/total_spent/keys/u1/add", json={"value": 1}).raise_for_status()

    command = documented_restore_command()
    env = {**os.environ, "REPLICA_URL": server.url}
    restored = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert json.loads(restored.stdout)["checkpoint_id"] == 42
    assert job.get("/states/total_spent/keys/u1").json() == {"value": 1}

    missing = command.replace('"checkpoint_id": 42', '"checkpoint_id": 4242')
    failed = subprocess.run(["bash", "-c", missing], env=env, capture_output=True, text=True, timeout=60)
    assert failed.returncode == 22  # curl's "HTTP error", and the problem is printed
    assert json.loads(failed.stdout)["code"] == "checkpoint_not_found"


# -- the client wheel's size ---------------------------------------------------------------


@pytest.mark.xdist_group("in-tree-build")  # the wheels fixture builds in the source tree
def test_the_client_wheel_is_the_size_the_docs_say(wheels):
    (documented,) = re.findall(r"statehouse_client-[\w.-]+\.whl \(~(\d+) KB\)", SPARK_DOC.read_text())
    wheel = wheels["statehouse_client"]
    assert zipfile.is_zipfile(wheel)
    size_kb = wheel.stat().st_size / 1000
    assert abs(size_kb - int(documented)) <= 0.15 * int(documented), f"the wheel is {size_kb:.0f} KB"


# -- a new user's Spark job, from docs/spark.md alone -----------------------------------------


def documented_job() -> tuple[str, str]:
    """The job (the first Python block) and the command that runs it (the block naming job.py)."""
    text = SPARK_DOC.read_text()
    section = text[text.index("## The few lines you write") : text.index("## Installing the client on executors")]
    job = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (command,) = [block for block in re.findall(r"```sh\n(.*?)```", section, re.S) if "job.py" in block]
    return job, command.strip()


@pytest.mark.spark
@pytest.mark.slow
def test_a_spark_job_written_from_the_docs_runs_first_time(own_replicas, tmp_path):
    job, command = documented_job()
    urls = re.findall(r'"(http://statehouse-\d:8000)"', job)
    assert len(urls) == 2, job
    for url, server in zip(urls, own_replicas, strict=True):
        job = job.replace(url, server.url)
    (tmp_path / "job.py").write_text(job)
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the doc's venv: this test's
    rng = random.Random(26)
    oracle: dict[str, float] = defaultdict(float)
    (tmp_path / "events").mkdir()
    for f in range(3):
        lines = []
        for _ in range(200):
            user, amount = f"u{rng.randrange(40)}", rng.randrange(1, 400) / 4  # exact in binary
            oracle[user] += amount
            lines.append(json.dumps({"user_id": user, "amount": amount}))
        (tmp_path / f"events/part-{f}.json").write_text("\n".join(lines) + "\n")

    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    # The JVM options this machine's Spark drivers start with, as spark-defaults would set them (twice
    # as fast a start); what runs is the doc's command and job.
    env["JDK_JAVA_OPTIONS"] = jvm_options()
    result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]

    with StatehouseClient([s.url for s in own_replicas]) as client:
        total = client.job("features").reducing_state("total_spent")
        assert {user: total.get(user) for user in oracle} == oracle
    written: dict[str, float] = {}
    for part in sorted(tmp_path.glob("features/batch_id=*/part-*.json")):
        for line in part.read_text().splitlines():
            row = json.loads(line)
            written[row["user_id"]] = max(written.get(row["user_id"], 0), row["total"])
    assert written == oracle


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        (
            "",
            {"max_parallism": 8},
            "body: unknown field 'max_parallism' (did you mean 'max_parallelism'?); this body takes: max_parallelism",
        ),
        (
            "/states/recent",
            {"kind": "list", "ttl": {"ms": 60000}},
            "body.ttl: unknown field 'ms'; this body takes: ttl_ms, update_type, visibility, cleanup_full_snapshot, "
            "cleanup_incremental_size",
        ),
    ],
)
def test_an_unknown_field_names_the_fields_the_body_takes(http, job_name, path, body, expected):
    if path:
        http.put(f"/jobs/{job_name}", json={}).raise_for_status()
    assert problem(http.put(f"/jobs/{job_name}{path}", json=body), 422, "validation_error") == expected


def test_a_missing_state_says_how_to_register_it(http, job_name):
    http.put(f"/jobs/{job_name}", json={}).raise_for_status()
    detail = problem(http.get(f"/jobs/{job_name}/states/spent/keys/alice"), 404, "state_not_found")
    assert (
        detail
        == f"""job '{job_name}' has no state 'spent'; register it first (PUT /v1/jobs/{job_name}/states/spent \
with {{"kind": ...}})"""
    )


def test_switching_ttl_on_says_what_to_do_instead(http, job_name):
    http.put(f"/jobs/{job_name}", json={}).raise_for_status()
    http.put(f"/jobs/{job_name}/states/recent", json={"kind": "list"}).raise_for_status()
    response = http.put(f"/jobs/{job_name}/states/recent", json={"kind": "list", "ttl": {"ttl_ms": 60000}})
    assert problem(response, 409, "incompatible_state").endswith(": delete the state first or use another name")


# -- generated clients: what docs/api.md says they have --------------------------------------


@pytest.mark.slow
def test_a_generated_client_is_what_the_docs_say(tmp_path):
    generator = Path(sys.executable).with_name("openapi-python-client")
    if not generator.exists():
        pytest.skip("openapi-python-client is not installed")
    text = (REPO / "docs/api.md").read_text()
    config = re.search(r"cat > client-config.yaml <<'YAML'\n(.*?)YAML\n", text, re.S).group(1)
    (tmp_path / "client-config.yaml").write_text(config)
    spec = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json; from statehouse.app.main import create_app; print(json.dumps(create_app().openapi()))",
        ],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("STATEHOUSE_")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (tmp_path / "openapi.json").write_text(spec)
    command = [str(generator), "generate", "--path", "openapi.json", "--config", "client-config.yaml", "--meta", "none"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    skipped = re.findall(r"WARNING parsing POST (\S+) .*\n\s*(\S.*)", result.stdout + result.stderr)
    assert skipped == []  # with the Arrow mapping, the columnar endpoints have their functions too
    (package,) = [p for p in tmp_path.iterdir() if (p / "models/batch_result.py").exists()]
    assert package.name == "statehouse_client"  # the name docs/api.md's example imports
    for function in ("batch/apply_columns.py", "batch/apply_states_columns.py", "timers/apply_timer_columns.py"):
        assert "    body: File," in (package / "api" / function).read_text(), function
    assert "    value: Any | Unset = UNSET" in (package / "models/batch_result.py").read_text()
