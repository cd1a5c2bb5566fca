"""The ``statehouse`` command over real processes: one local 3-replica set started by
``statehouse serve``, driven through status → savepoint → checkpoints → restore → a live rescale
3 → 2 → 3 (``serve`` stops the removed replica after the commit, and starts the new one before the
grow), every key checked against a plain-Python oracle; the offline rescale's refusal path; a client
given the URLs in the wrong order, or one seed URL, works; a client opened before the rescale
refreshes its layout on the newer version; every command's ``--help`` and ``--json``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from typing import Any

import pytest

from statehouse.client import StatehouseClient
from statehouse.client.cli import COMMANDS
from statehouse.client.cli.serve import read_state
from tests.support.cli import CLI, Served, cli, cli_json, environment, free_ports
from tests.support.server import REPO, free_port

pytestmark = [pytest.mark.http]

JOB = "shop"
KEYS = [f"user-{i}" for i in range(300)]
COMMAND_NAMES = [module.__name__.rsplit(".", 1)[1] for module in COMMANDS]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = tmp_path_factory.mktemp("served")
    command = [*CLI, "serve", "--replicas", "3", "--port", str(free_ports(3)), "--dir", str(directory), "--json"]
    with open(directory / "serve.out", "wb") as out:
        process = subprocess.Popen(command, env=environment(), cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while (state := read_state(directory)) is None or state["status"] != "ready":
        assert process.poll() is None, (directory / "serve.out").read_text()
        assert time.monotonic() < deadline, "the set did not start: " + (directory / "serve.out").read_text()
        time.sleep(0.1)
    announced = json.loads((directory / "serve.out").read_text())  # --json: the set's one document
    assert announced["urls"] == state["urls"] and announced["replicas"] == 3
    yield Served(directory, process, state["urls"])
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 0, (directory / "serve.out").read_text()
    assert read_state(directory) is None  # the state file goes with the set


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_every_command_has_help_with_json_and_exit_codes(command):
    shown = cli(command, "--help").stdout
    assert "--json" in shown and "exit codes:" in shown and "  4    waiting on the operator" in shown
    assert command == "serve" or "--urls" in shown


@pytest.mark.slow
def test_errors_are_one_line_with_their_exit_code(served, tmp_path):
    missing = cli("status", code=2)
    assert missing.stderr == "statehouse status: give the replicas' URLs with --urls or STATEHOUSE_URLS\n"
    down = cli("status", urls=f"http://127.0.0.1:{free_port()}", code=3)
    assert down.stderr.startswith("statehouse status: http://127.0.0.1:") and down.stderr.count("\n") == 1
    assert "did not answer GET /v1/topology" in down.stderr
    unknown = cli("checkpoints", "nope", urls=served.urls[0], code=1)
    assert (
        unknown.stderr == "statehouse checkpoints: no job 'nope' on the replicas (statehouse status lists the jobs)\n"
    )
    no_plan = cli(
        "rescale", "--offline", "--resume", "--plan", str(tmp_path / "none.json"), urls=served.urls[0], code=2
    )
    assert "no rescale plan at" in no_plan.stderr
    nothing = cli("rescale", "--abort", urls=served.urls[0], code=1)
    assert nothing.stderr.startswith("statehouse rescale: no rescale is pending, nothing to abort: the set serves ")
    assert nothing.stderr.count("\n") == 1
    unstarted = cli("rescale", "--to", "4", urls=served.urls[0], code=4)
    assert "needs the 1 new replicas' URLs" in unstarted.stderr and unstarted.stderr.count("\n") == 1


def test_status_shows_a_job_that_some_replica_lacks(served):
    """A job on one replica only (its create stopped half way, a replica restored without it) is
    listed as not serving, with the replica that lacks it: nothing to crash on."""
    with StatehouseClient(served.urls) as sh:
        sh.replicas[0].json("PUT", "/v1/jobs/half", {"max_parallelism": 8})
        try:
            shown = cli_json("status", urls=served.urls[0])
            half = next(job for job in shown["jobs"] if job["job"] == "half")
            assert half["key_group_ranges"][1:] == [None] * (len(served.urls) - 1) and not half["serving"]
            line = next(x for x in cli("status", urls=served.urls[0]).stdout.splitlines() if "half:" in x)
            assert "missing" in line and "NOT SERVING" in line
        finally:
            sh.replicas[0].json("DELETE", "/v1/jobs/half")


def values(sh: StatehouseClient) -> dict[str, Any]:
    return {k: v for k, v in zip(KEYS, sh.job(JOB).value_state("total").get_many(KEYS), strict=True)}


@pytest.mark.slow  # two restarts of the set: about a minute
def test_serve_status_savepoint_restore_rescale(served):
    urls = served.urls
    oracle = {key: i for i, key in enumerate(KEYS)}
    with StatehouseClient(urls[::-1]) as sh:  # the wrong order: learned from the replicas
        job = sh.create_job(JOB, max_parallelism=64)
        assert sh.replicas.urls == urls
        job.register("total", "value")
        with job.batch() as batch:
            for key, value in oracle.items():
                batch.put("total", key, value)
        assert values(sh) == oracle

    status = cli_json("status", urls=urls[2])  # one seed URL: the replicas advertise their peers
    assert (status["replica_count"], status["version"]) == (3, 1)
    assert [r["url"] for r in status["replicas"]] == urls
    assert status["jobs"] == [
        {
            "job": JOB,
            "max_parallelism": 64,
            "key_group_ranges": [[0, 21], [22, 42], [43, 63]],
            "serving": True,
            "latest_checkpoint": None,
        }
    ]

    taken = cli_json("savepoint", JOB, urls=urls[0])
    assert taken["kind"] == "savepoint" and len(taken["locations"]) == 3
    with StatehouseClient(urls[0]) as sh:  # writes after the savepoint, which the restore undoes
        sh.job(JOB).value_state("total").put_many(KEYS[:50], [-1] * 50)
        assert values(sh) != oracle
    listed = cli_json("checkpoints", JOB, urls=urls[0])
    assert [(c["checkpoint_id"], c["kind"]) for c in listed["checkpoints"]] == [(taken["checkpoint_id"], "savepoint")]
    assert cli_json("status", urls=urls[0])["jobs"][0]["latest_checkpoint"] == {
        "checkpoint_id": taken["checkpoint_id"],
        "kind": "savepoint",
    }
    restored = cli_json("restore", JOB, "--latest", urls=urls[1])
    assert restored["checkpoint_id"] == taken["checkpoint_id"]
    assert sum(r["entries_restored"] for r in restored["replicas"]) == len(KEYS)
    with StatehouseClient(urls) as sh:
        assert values(sh) == oracle

    # Clients opened before the rescale, each used after it: one call per key, a columnar read, a batch.
    stale = [StatehouseClient(urls) for _ in range(3)]
    try:
        one_by_one, columnar, batched = (sh.job(JOB) for sh in stale)
        assert all((sh.replicas.version, len(sh.replicas)) == (1, 3) for sh in stale)

        human = cli("rescale", "--to", "2", "--serve-dir", str(served.directory), urls=urls[0])
        assert human.stdout.startswith("rescaled 3 -> 2 replicas live (topology version 2) in ")
        assert "prepared: topology version 2" in human.stderr and "committed: " in human.stderr

        status = cli_json("status", urls=urls[0])
        assert (status["replica_count"], status["version"]) == (2, 2)
        assert [r["url"] for r in status["replicas"]] == urls[:2]
        assert status["jobs"][0]["key_group_ranges"] == [[0, 31], [32, 63]] and status["jobs"][0]["serving"]
        removed = [p.name for p in served.directory.iterdir() if p.name.startswith("data-2.removed-v2-")]
        assert len(removed) == 1  # replica 2's data moved aside, never to rejoin as current

        # Keys owned by the removed replica (unreachable) and keys moved between the others (421).
        total = one_by_one.value_state("total")
        assert {key: total.value(key) for key in KEYS} == oracle
        assert dict(zip(KEYS, columnar.value_state("total").get_many(KEYS), strict=True)) == oracle
        with batched.batch() as batch:
            for key in KEYS:
                batch.put("total", key, oracle[key] * 2)
        oracle = {key: value * 2 for key, value in oracle.items()}
        assert all((sh.replicas.version, sh.replicas.urls) == (2, urls[:2]) for sh in stale)
        with StatehouseClient(urls[:2]) as sh:
            assert values(sh) == oracle
    finally:
        for sh in stale:
            sh.close()

    # Grown by `serve` itself: a new, empty replica 2 started before the move.
    again = cli_json("rescale", "--to", "3", "--serve-dir", str(served.directory), urls=urls[0])
    assert again["status"] == "done" and again["urls"] == urls and again["version"] == 3
    assert again["ranges"][JOB] == [[0, 21], [22, 42], [43, 63]]
    assert again["copied"][urls[2]]["entries"] > 0  # the bulk moved by the pre-copy
    assert read_state(served.directory)["urls"] == urls
    with StatehouseClient(urls[1]) as sh:
        assert sh.topology()[0]["version"] == 3
        assert values(sh) == oracle


def test_rescale_of_a_set_it_does_not_run_says_what_to_do(served, tmp_path):
    """Without a `statehouse serve` to restart, rescale savepoints, keeps its plan and exits 4
    with the restart to do; resumed before that restart, it says the set is not there yet."""
    plan = tmp_path / "plan.json"
    asked = cli(
        "rescale",
        "--all",
        "--to",
        "2",
        "--offline",
        "--plan",
        str(plan),
        "--json",
        urls=served.urls[0],
        code=4,
        cwd=tmp_path,
    )
    told = json.loads(asked.stdout)
    assert told["status"] == "restart_needed" and plan.exists()
    version = told["plan"]["version"] + 1
    assert (
        f"STATEHOUSE_REPLICA_COUNT=2 STATEHOUSE_ADOPT_TOPOLOGY=1 STATEHOUSE_TOPOLOGY_VERSION={version}" in told["next"]
    )
    assert f"--set topologyVersion={version}" in told["next"] and "statehouse rescale --resume" in told["next"]
    early = cli("rescale", "--resume", "--plan", str(plan), urls=served.urls[0], code=4, cwd=tmp_path)
    assert early.stderr.startswith("statehouse rescale: the replicas are 3 of set ")
    restart = f"STATEHOUSE_REPLICA_COUNT=2 STATEHOUSE_ADOPT_TOPOLOGY=1 STATEHOUSE_TOPOLOGY_VERSION={version}"
    assert f"restart them with {restart}" in early.stderr
    assert plan.exists()  # kept until a resumed run verifies the rescale
