"""``statehouse rescale`` as an operator runs it, against real replicas: a target is checked before
anything starts (M >= 1, M <= every job's max_parallelism; a move pending on the replicas refuses
another target), a refused command starts and changes nothing, a ``statehouse serve`` set's
processes and its statehouse-serve.json match the layout that serves after a grow, a shrink, an
aborted grow, a failed start and a resume, and ``--resume`` of a move that ended without the
command (a joining replica that died mid-commit commits itself when it restarts) says it is done.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from statehouse.client import StatehouseClient
from statehouse.client.cli.serve import read_state, state_path
from statehouse.client.coordinator import CheckpointCoordinator
from statehouse.client.rescale import LiveRescale
from statehouse.protocol.keygroups import assign_to_key_group, operator_index
from tests.support.cli import CLI, Served, cli, environment, free_ports
from tests.support.replica_set import ReplicaSet
from tests.support.server import REPO

pytestmark = [pytest.mark.http]

JOB, SMALL, STATE = "shop", "small", "total"
P = 8  # the shop job's max parallelism; the small job's is 4
KEYS = [f"user-{i}" for i in range(200)]


# -- a `statehouse serve` set, and what it runs ------------------------------------------------------------


@pytest.fixture
def served(tmp_path) -> Iterator[Served]:
    """A fresh 2-replica `statehouse serve` set (ports for a third kept free), with the jobs
    ``shop`` (max_parallelism 8, every key of KEYS written) and ``small`` (4)."""
    directory = tmp_path / "set"
    directory.mkdir()
    port = free_ports(3)
    command = [*CLI, "serve", "--replicas", "2", "--port", str(port), "--dir", str(directory), "--json"]
    with open(directory / "serve.out", "wb") as out:
        process = subprocess.Popen(command, env=environment(), cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while (state := read_state(directory)) is None or state["status"] != "ready":
            assert process.poll() is None, (directory / "serve.out").read_text()
            assert time.monotonic() < deadline, "the set did not start: " + (directory / "serve.out").read_text()
            time.sleep(0.1)
        with StatehouseClient(state["urls"]) as sh:
            sh.create_job(SMALL, max_parallelism=4)
            job = sh.create_job(JOB, max_parallelism=P)
            job.register(STATE, "value")
            job.value_state(STATE).put_many(KEYS, list(range(len(KEYS))))
        yield Served(directory, process, state["urls"])
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, (directory / "serve.out").read_text()
    assert read_state(directory) is None


ORACLE = {key: i for i, key in enumerate(KEYS)}


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            state, parent = stat.read_text().rsplit(")", 1)[1].split()[:2]
            if int(parent) == pid and state != "Z":
                found.append(int(stat.parent.name))
    return found


def served_ports(pid: int) -> list[int]:
    """The ports of the replica processes ``pid`` runs (each is ``statehouse.app.serve --port N``)."""
    ports = []
    for child in children(pid):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{child}/cmdline").read_bytes().decode().split("\0")
            if "statehouse.app.serve" in argv:
                ports.append(int(argv[argv.index("--port") + 1]))
    return sorted(ports)


def port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def urls_of(served: Served, count: int) -> list[str]:
    """The URLs of the set's replicas 0..count-1 (serve runs replica i on replica 0's port + i)."""
    return [f"http://127.0.0.1:{port(served.urls[0]) + i}" for i in range(count)]


def topology(url: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/v1/topology", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def matches(served: Served, count: int, version: int) -> None:
    """The serve set runs exactly the ``count`` replicas of the layout that serves (version
    ``version``), and its status file names exactly those; replica i keeps its data in data-<i>."""
    state = read_state(served.directory)
    assert state is not None and state["status"] == "ready"
    assert state["urls"] == urls_of(served, count) and state["replicas"] == count
    assert served_ports(served.process.pid) == [port(url) for url in urls_of(served, count)]
    for index, url in enumerate(state["urls"]):
        shown = topology(url)
        assert (shown["replica_index"], shown["replica_count"], shown["version"]) == (index, count, version)
        assert not shown["retired"] and not shown["unassigned"] and shown["move"] is None
        assert httpx.get(f"{url}/readyz", timeout=30).status_code == 200
    data = sorted(p.name for p in served.directory.iterdir() if p.name.startswith("data-") and "." not in p.name)
    assert data == [f"data-{i}" for i in range(count)]


def moved_aside(served: Served, index: int) -> list[str]:
    """The names a removed replica ``index``'s data directories were moved aside to."""
    return sorted(p.name for p in served.directory.iterdir() if p.name.startswith(f"data-{index}.removed-"))


def untouched(served: Served) -> tuple[bytes, list[int], list[str]]:
    """What a refused command must leave as it was: the status file, the processes, the files."""
    names = sorted(p.name for p in served.directory.iterdir() if not p.name.endswith(".log"))
    return state_path(served.directory).read_bytes(), served_ports(served.process.pid), names


def values(url: str) -> dict[str, Any]:
    with StatehouseClient(url) as sh:
        return dict(zip(KEYS, sh.job(JOB).value_state(STATE).get_many(KEYS), strict=True))


def refusal(done: subprocess.CompletedProcess) -> str:
    """The command's one error line (progress lines may come before it)."""
    errors = [line for line in done.stderr.splitlines() if line.startswith("statehouse rescale:")]
    assert len(errors) == 1 and done.stderr.endswith(errors[0] + "\n"), done.stderr
    return errors[0]


class Stopped(Exception):
    """Raised by a progress callback: the driver stops there, as a coordinator that died would."""


def stop_at(name: str):
    def progress(step: str, info: dict[str, Any]) -> None:
        if step == name:
            raise Stopped(step)

    return progress


def stopped(move: LiveRescale) -> None:
    """Run ``move`` until its progress callback stops it, leaving the move pending."""
    with move, pytest.raises(Stopped):
        move.run()


# -- the target checked before anything starts ------------------------------------------------------------


@pytest.mark.slow
def test_a_refused_target_starts_and_changes_nothing(served):
    url, where = served.urls[0], served.directory  # run in the set's directory: its serve is found by itself
    before = untouched(served)
    for to in ("0", "-1"):
        done = cli("rescale", "--to", to, urls=url, code=2, cwd=where)
        assert done.stderr == f"statehouse rescale: --to {to}: M must be >= 1 (the replica count after the rescale)\n"
    too_many = (
        "statehouse rescale: --to 5: job 'small' has max_parallelism 4, so it cannot be spread over more than 4 "
        "replicas (M must be <= every job's max_parallelism)\n"
    )
    assert cli("rescale", "--to", "5", urls=url, code=2, cwd=where).stderr == too_many
    assert cli("rescale", "--to", "5", "--serve-dir", str(where), urls=url, code=2).stderr == too_many
    plan = where / "plan.json"
    offline = cli("rescale", "--all", "--to", "5", "--offline", "--plan", str(plan), urls=url, code=2, cwd=where)
    assert offline.stderr == too_many and not plan.exists()
    assert cli("rescale", "--to", "0", "--offline", "--all", urls=url, code=2, cwd=where).stderr == (
        "statehouse rescale: --to 0: M must be >= 1 (the replica count after the rescale)\n"
    )
    same = cli("rescale", "--to", "2", urls=url, code=1, cwd=where)
    assert same.stderr == "statehouse rescale: the replica set already has 2 replicas\n"

    # Nothing pending and no move ever made: --resume says where the set stands, --abort has nothing to do.
    layout = "the set serves topology version 1 with 2 replicas"
    resumed = cli("rescale", "--resume", urls=url, cwd=where)
    assert resumed.stdout == f"no rescale is pending: {layout}\nSTATEHOUSE_URLS={','.join(served.urls)}\n"
    aborted = cli("rescale", "--abort", urls=url, code=1, cwd=where)
    assert aborted.stderr == f"statehouse rescale: no rescale is pending, nothing to abort: {layout}\n"

    assert untouched(served) == before
    matches(served, 2, 1)


@pytest.mark.slow  # three moves of a 2-replica set: about half a minute
def test_a_pending_move_refuses_another_target_and_resume_fits_the_served_set(served):
    """A move left pending (its coordinator died after prepare) refuses a different target with
    exit 4 and nothing started; --resume finishes it and the serve set stops the replica it retired."""
    url, where = served.urls[0], served.directory
    with StatehouseClient(served.urls) as sh:
        stopped(LiveRescale(sh, 1, progress=stop_at("prepared")))
    before = untouched(served)
    for to in ("3", "9"):
        refused = cli("rescale", "--to", to, urls=url, code=4, cwd=where)
        assert refused.stderr == (
            "statehouse rescale: a rescale to 1 replicas (topology version 2) is pending: finish or abort it "
            f"(statehouse rescale --resume|--abort) before rescaling to {to}\n"
        )
    assert untouched(served) == before  # no replica 2 started, no data-2, the status file as it was

    # Resumed from one seed URL, the other one's: the committed shrink stops the retired replica.
    resumed = cli("rescale", "--resume", urls=served.urls[1], cwd=where)
    assert resumed.stdout.startswith("rescaled 2 -> 1 replicas live (topology version 2) in ")
    matches(served, 1, 2)
    assert len(moved_aside(served, 1)) == 1 and moved_aside(served, 1)[0].startswith("data-1.removed-v2-")
    assert values(url) == ORACLE

    again = cli("rescale", "--resume", urls=url, cwd=where)
    assert again.stdout == (
        "the rescale 2 -> 1 replicas (topology version 2) is done: nothing to resume, the set serves it\n"
        f"STATEHOUSE_URLS={url}\n"
    )
    document = json.loads(cli("rescale", "--resume", "--json", urls=url, cwd=where).stdout)
    assert {k: document[k] for k in ("status", "from", "to", "version", "urls")} == {
        "status": "done",
        "from": 2,
        "to": 1,
        "version": 2,
        "urls": [url],
    }
    nothing = cli("rescale", "--abort", urls=url, code=1, cwd=where)
    assert nothing.stderr == (
        "statehouse rescale: no rescale is pending, nothing to abort: the set serves topology version 2 with 1 "
        "replicas\n"
    )

    # Grown back by the serve set: a new, empty replica 1 (its old data stays aside).
    grown = json.loads(cli("rescale", "--to", "2", "--json", urls=url, cwd=where).stdout)
    assert (grown["status"], grown["version"], grown["urls"]) == ("done", 3, served.urls)
    matches(served, 2, 3)
    assert values(served.urls[1]) == ORACLE


def key_in(first: int, last: int) -> str:
    """A key of the shop job whose key group lies in [first, last]."""
    probes = (f"probe-{i}" for i in range(10_000))
    return next(k for k in probes if first <= assign_to_key_group(k, "string", P) <= last)


@pytest.mark.slow  # a failed start, an aborted grow, a grow and a shrink: about a minute
def test_an_aborted_or_failed_grow_leaves_the_served_set_as_it_was(served):
    url, where = served.urls[0], served.directory

    # The new replica cannot start (its port is taken): the set is back as it was, the command says why.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port(served.urls[0]) + 2))
        taken.listen()
        failed = refusal(cli("rescale", "--to", "3", urls=url, code=1, cwd=where))
    assert failed.startswith("statehouse rescale: could not start replicas 2..2 (replica 2 exited at start: ")
    assert failed.endswith("); the set is as it was")
    matches(served, 2, 1)
    assert read_state(where)["failed"] == failed.removeprefix("statehouse rescale: ")  # what serve reported
    assert [name.startswith("data-2.removed-v1-") for name in moved_aside(served, 2)] in ([], [True])

    # A micro-batch's staged write in a key group replica 1 would give away holds prepare past --wait:
    # the move aborts, and the replica the serve set started for it is stopped again.
    moving = key_in(6, 7)
    assert operator_index(P, 2, assign_to_key_group(moving, "string", P)) == 1
    jobs = f"{served.urls[1]}/v1/jobs/{JOB}"
    assert httpx.post(f"{jobs}/fence", json={"epoch": 1}, timeout=30).status_code == 200
    staged = {"ops": [{"op": "put", "state": STATE, "key": moving, "value": -1}], "epoch": 1}
    response = httpx.post(f"{jobs}/batch", json={**staged, "partition": 0, "attempt": "a", "seq": 0}, timeout=30)
    assert response.status_code == 200, response.text
    held = cli("rescale", "--to", "3", "--wait", "2", urls=url, code=1, cwd=where)
    assert refusal(held).startswith(
        "statehouse rescale: the rescale to 3 replicas was aborted (the old layout serves): "
    )
    assert "waiting for a micro-batch to end: " in held.stderr
    matches(served, 2, 1)
    assert any(name.startswith("data-2.removed-v1-") for name in moved_aside(served, 2))

    # Run again, --resume and --abort say the attempt was aborted: nothing to do, exit 0.
    layout = "the set serves topology version 1 with 2 replicas"
    for flag in ("--resume", "--abort"):
        said = cli("rescale", flag, urls=url, cwd=where)
        assert said.stdout.splitlines()[0] == f"the rescale to topology version 2 was aborted: {layout}"
    assert httpx.post(f"{jobs}/epochs/1/abort", timeout=30).status_code == 200

    # The next attempt takes version 3; the shrink after it stops replica 2 and names its data v4.
    grown = json.loads(cli("rescale", "--to", "3", "--json", urls=url, cwd=where).stdout)
    assert (grown["status"], grown["version"], grown["urls"]) == ("done", 3, urls_of(served, 3))
    matches(served, 3, 3)
    assert values(urls_of(served, 3)[2]) == ORACLE
    shrunk = json.loads(cli("rescale", "--to", "2", "--json", urls=urls_of(served, 3)[2], cwd=where).stdout)
    assert (shrunk["status"], shrunk["version"], shrunk["urls"]) == ("done", 4, served.urls[:2])
    matches(served, 2, 4)
    assert any(name.startswith("data-2.removed-v4-") for name in moved_aside(served, 2))
    assert values(url) == ORACLE


# -- --resume of a move that finished without the command --------------------------------------------------


def two_replicas_with_the_job(replicas: ReplicaSet) -> list[str]:
    """Two replicas started, the job created on them, its value state holding KEYS' values (their
    indexes): their URLs."""
    urls = replicas.start(2)
    with StatehouseClient(urls) as sh:
        job = sh.create_job(JOB, max_parallelism=P)
        job.register(STATE, "value")
        job.value_state(STATE).put_many(KEYS, list(range(len(KEYS))))
    return urls


@pytest.mark.slow  # a joining replica killed and restarted: about half a minute
def test_resume_of_a_move_a_restarted_replica_finished_says_it_is_done(tmp_path):
    """The joining replica dies after the commit was decided: --resume commits the others and exits
    4 with what to do (start it, then --resume); restarted, it commits itself (its load was done), and
    --resume then says the move is done and exits 0."""
    replicas = ReplicaSet(tmp_path, {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")})
    try:
        urls = two_replicas_with_the_job(replicas)
        joining = replicas.add(2, 3, version=2).url
        with StatehouseClient(urls) as sh:
            stopped(LiveRescale(sh, 3, [joining], progress=stop_at("decided")))
        replicas.servers[2].stop(signal.SIGKILL)

        told = refusal(cli("rescale", "--resume", "--wait", "1", urls=urls[0], code=4))
        assert told.startswith(
            f"statehouse rescale: commit of the rescale to 3 replicas was decided, but {joining} did not commit "
        )
        assert told.endswith("once it answers, run statehouse rescale --resume")

        replicas.restart(2)  # in place: it reads the decision and commits itself
        shown = topology(joining)
        assert (shown["replica_index"], shown["replica_count"], shown["version"], shown["move"]) == (2, 3, 2, None)
        urls = [*urls, joining]
        done = cli("rescale", "--resume", urls=urls[0])
        assert done.stdout == (
            "the rescale 2 -> 3 replicas (topology version 2) is done: nothing to resume, the set serves it\n"
            f"STATEHOUSE_URLS={','.join(urls)}\n"
        )
        assert done.stderr == ""
        status = json.loads(cli("status", "--json", urls=urls[1]).stdout)
        assert (status["replica_count"], status["version"]) == (3, 2)
        assert values(urls[2]) == ORACLE
    finally:
        replicas.stop()


# -- status and checkpoints agree on the latest global checkpoint --------------------------------------------


def latest_of_both(urls: list[str]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """What `statehouse status` names as the job's latest global checkpoint (its JSON and its
    line), and the last one `statehouse checkpoints` lists: the same checkpoint, or both none."""
    listed = json.loads(cli("checkpoints", JOB, "--json", urls=urls).stdout)["checkpoints"]
    newest = {"checkpoint_id": listed[-1]["checkpoint_id"], "kind": listed[-1]["kind"]} if listed else None
    status = json.loads(cli("status", "--json", urls=urls).stdout)
    shown = next(job for job in status["jobs"] if job["job"] == JOB)["latest_checkpoint"]
    line = next(x for x in cli("status", urls=urls).stdout.splitlines() if x.startswith(f"  {JOB}:"))
    said = f"latest global checkpoint: {shown['kind']} {shown['checkpoint_id']}" if shown else "none"
    assert line.endswith(said), line
    return shown, newest


@pytest.mark.slow
def test_status_names_the_newest_checkpoint_that_checkpoints_lists_across_a_rescale(tmp_path):
    """Before a live rescale, right after it (only the earlier layout's checkpoints are there, and
    a restore takes them) and after the new layout's own: `statehouse status` names the newest
    checkpoint `statehouse checkpoints` lists, and `statehouse restore --latest` restores it."""
    replicas = ReplicaSet(tmp_path, {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")})
    try:
        urls = two_replicas_with_the_job(replicas)
        with StatehouseClient(urls) as sh:
            coordinator = CheckpointCoordinator(sh.job(JOB))
            taken = [coordinator.checkpoint().checkpoint_id for _ in range(2)]
            taken.append(coordinator.savepoint().checkpoint_id)
        shown, newest = latest_of_both(urls)
        assert shown == newest == {"checkpoint_id": taken[-1], "kind": "savepoint"}

        joining = replicas.add(2, 3, version=2).url
        with StatehouseClient(urls) as sh, LiveRescale(sh, 3, [joining], wait=120) as move:
            assert move.run().outcome == "committed"
        shown, newest = latest_of_both([*urls, joining])
        assert shown == newest and shown is not None and shown["checkpoint_id"] >= taken[-1]
        # `restore --latest` takes the same one (a restore of the move's own checkpoint changes nothing).
        restored = json.loads(cli("restore", JOB, "--latest", "--json", urls=[*urls, joining]).stdout)
        assert restored["checkpoint_id"] == shown["checkpoint_id"]
        with StatehouseClient([*urls, joining]) as sh:
            assert sh.job(JOB).value_state(STATE).get_many(KEYS).tolist() == list(range(len(KEYS)))

        with StatehouseClient([*urls, joining]) as sh:
            own = CheckpointCoordinator(sh.job(JOB)).checkpoint().checkpoint_id
        shown, newest = latest_of_both([*urls, joining])
        assert shown == newest == {"checkpoint_id": own, "kind": "checkpoint"}
    finally:
        replicas.stop()
