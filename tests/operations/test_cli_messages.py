"""What the ``statehouse`` command prints, against two real replicas: a replica that does not answer
is one short line saying why (not urllib3's 300-character error), a savepoint's location is shown
once, and a job some replica lacks comes with advice that works without a checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from statehouse.client import StatehouseClient
from statehouse.client.errors import Unavailable
from statehouse.client.transport import ReplicaConnection
from tests.support.server import REPO, free_port, start_server

pytestmark = [pytest.mark.http]

CLI = [sys.executable, "-m", "statehouse.client"]


def cli(*args: str, urls: str, code: int = 0) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("STATEHOUSE_")}, "STATEHOUSE_URLS": urls}
    done = subprocess.run([*CLI, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    return done


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    shared = str(tmp_path_factory.mktemp("cli-checkpoints"))
    servers = []
    try:
        for i in range(2):
            env = {
                "STATEHOUSE_REPLICA_INDEX": str(i),
                "STATEHOUSE_REPLICA_COUNT": "2",
                "STATEHOUSE_CHECKPOINT_DIR": shared,
            }
            servers.append(start_server(tmp_path_factory.mktemp(f"cli-{i}"), env))
        yield [s.url for s in servers]
    finally:
        for server in servers:
            server.stop()


def no_answer(url: str) -> str:
    """What the client says when ``url`` does not answer."""
    connection = ReplicaConnection(url, retries=0, timeout=5)
    try:
        with pytest.raises(Unavailable) as raised:
            connection.json("GET", "/v1/topology")
    finally:
        connection.close()
    return raised.value.detail


def test_why_a_replica_did_not_answer_in_a_few_words():
    refused = f"http://127.0.0.1:{free_port()}"
    assert no_answer(refused) == f"{refused} unreachable: connection refused"
    unknown = "http://no-such-host.invalid:8000"
    assert no_answer(unknown) == f"{unknown} unreachable: its host name does not resolve"


def test_an_unreachable_url_is_one_short_line():
    down = f"http://127.0.0.1:{free_port()}"
    shown = cli("status", urls=down, code=3).stderr
    assert shown == (
        f"statehouse status: {down} did not answer GET /v1/topology ({down} unreachable: connection refused): "
        "start that replica, or fix its URL\n"
    )
    saved = cli("savepoint", "shop", urls=down, code=3).stderr
    assert saved.count("\n") == 1 and "unreachable: connection refused" in saved and "MaxRetryError" not in saved


def test_a_savepoints_location_is_shown_once(replicas):
    with StatehouseClient(replicas) as sh:
        sh.create_job("saved", 16).register("v", "value").update("k", 1)
    first = json.loads(cli("savepoint", "saved", "--json", urls=",".join(replicas)).stdout)
    assert len(first["locations"]) == 2 and len(set(first["locations"])) == 1  # one directory, two parts
    lines = cli("savepoint", "saved", urls=",".join(replicas)).stdout.splitlines()
    taken = int(lines[0].split()[1])
    head, _id, tail = first["locations"][0].rpartition(str(first["checkpoint_id"]))  # the id names the directory
    assert lines == [f"savepoint {taken} of job saved: completed on 2 replicas", f"  {head}{taken}{tail}"]


def test_a_job_a_replica_lacks_says_how_to_create_it_there(replicas):
    with StatehouseClient(replicas) as sh:
        sh.replicas[0].json("PUT", "/v1/jobs/half", {"max_parallelism": 8})
        try:
            line = next(x for x in cli("status", urls=",".join(replicas)).stdout.splitlines() if "half:" in x)
        finally:
            sh.replicas[0].json("DELETE", "/v1/jobs/half")
    assert line.endswith(
        'NOT SERVING (missing on replica 1: create it there, PUT /v1/jobs/half {"max_parallelism": 8}, '
        "or restore it from a checkpoint: statehouse restore half --latest)"
    ), line
