"""The server side of a live rescale (docs/rescale.md): the move recorded in each replica's
topology, the durable decision, and the steps prepare / load / decide / commit / abort over HTTP.

In process first (the record, the ranges, the decision, the restart rules), then real servers
(both backends) driven through the raw endpoints: every key equal to a dict oracle and stored only
on its owner, writes to moving key groups 503 between prepare and commit and 421 with v+1 after,
restarts on either side of the decision.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing.decision import Decision, RescaleDecided, decide, read_decision
from statehouse.backends.checkpointing.manager import CheckpointManager
from statehouse.backends.checkpointing.rescale import RescaleParticipant
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.backends.topology import (
    TOPOLOGY_FILE,
    Move,
    Previous,
    ReplicaLayout,
    Topology,
    TopologyError,
    start_action,
    subtract,
)
from statehouse.protocol.keygroups import KeyGroupRange, assign_to_key_group, operator_index
from statehouse.snapshots.storage.local import LocalStorage
from statehouse.snapshots.stored.descriptors import StateDescriptor
from tests.support.metrics import metric
from tests.support.replica_set import ReplicaSet, misplaced
from tests.support.server import start_server

# -- in process: the record, the ranges, the decision ---------------------------------------------------


def test_ranges_that_move_out_and_in():
    grow = Move(2, 3, 2)  # 2 -> 3 replicas, P = 128: [0,63] [64,127] -> [0,42] [43,85] [86,127]
    assert grow.moving_out(128, 0) == [KeyGroupRange(43, 63)] and grow.moving_in(128, 0) == []
    assert grow.moving_out(128, 1) == [KeyGroupRange(86, 127)] and grow.moving_in(128, 1) == [KeyGroupRange(43, 63)]
    assert grow.moving_out(128, 2) == [] and grow.moving_in(128, 2) == [KeyGroupRange(86, 127)]
    shrink = Move(3, 2, 3)
    assert shrink.moving_out(128, 2) == [KeyGroupRange(86, 127)] and shrink.moving_in(128, 2) == []
    assert shrink.moving_in(128, 1) == [KeyGroupRange(86, 127)]
    joining = Move(2, 3, 0)  # a new replica held nothing: all of W_i moves in
    assert joining.moving_in(128, 1) == [KeyGroupRange(43, 85)]
    assert subtract(KeyGroupRange(0, 10), KeyGroupRange(3, 5)) == [KeyGroupRange(0, 2), KeyGroupRange(6, 10)]


def test_the_record_keeps_a_move_and_reads_one_written_before_moves(tmp_path):
    move = Move(2, 3, 2, ("http://a", "http://b", "http://c"), "loaded", False, {"orders": 7}, 12.5)
    topology = Topology("set", 2, 1, 1, move=move, previous=Previous(1, 0, True), replica_urls=("http://x",))
    assert Topology.from_json(json.loads(json.dumps(topology.to_json()))) == topology
    old = {"format": 1, "set_id": "s", "replica_count": 2, "replica_index": 0, "version": 3, "jobs": {}}
    assert Topology.from_json(old) == Topology("s", 2, 0, 3)


def open_layout(data_dir, count, index, version=None):
    return ReplicaLayout.open(str(data_dir), count=count, index=index, set_id=None, adopt=False, version=version)


def test_a_committed_record_is_served_when_the_environment_names_the_layout_before_it(tmp_path, caplog):
    layout = open_layout(tmp_path, 2, 1)
    layout.begin_move(Move(2, 3, 2))
    # Pending: the environment may already name the target; the record (2 replicas) is served.
    assert open_layout(tmp_path, 3, 1, 2).topology.count == 2
    open_layout(tmp_path, 2, 1).commit_move()
    caplog.clear()
    for version in (None, 1):
        reopened = open_layout(tmp_path, 2, 1, version).topology
        assert (reopened.count, reopened.index, reopened.version, reopened.move) == (3, 1, 2, None)
    assert "set STATEHOUSE_REPLICA_COUNT=3 STATEHOUSE_TOPOLOGY_VERSION=2" in caplog.text
    assert open_layout(tmp_path, 3, 1, 2).topology.previous == Previous(2, 1)
    with pytest.raises(TopologyError):  # neither the record's layout nor the one before it
        open_layout(tmp_path, 4, 1)
    saved = json.loads((tmp_path / TOPOLOGY_FILE).read_text())
    assert saved["previous"] == {"count": 2, "version": 1, "dropped": False} and saved["move"] is None


def test_a_start_follows_the_decision():
    prepared = Topology("s", 2, 1, 1, move=Move(2, 3, 2))
    loaded = Topology("s", 2, 1, 1, move=Move(2, 3, 2, phase="loaded"))
    removed = Topology("s", 3, 2, 1, move=Move(2, 2, 3))  # 3 -> 2: replica 2 loads nothing
    assert start_action(Topology("s", 2, 1, 1), None)[0] == "serve"
    assert [start_action(t, "commit")[0] for t in (prepared, loaded, removed)] == ["wait", "commit", "commit"]
    assert {start_action(t, "abort")[0] for t in (prepared, loaded)} == {"abort"}
    assert start_action(loaded, None)[0] == "wait"


def test_the_decision_is_written_once(tmp_path):
    storage = LocalStorage(str(tmp_path))
    assert read_decision(storage, "set", 2) is None
    first = decide(storage, Decision("set", 2, "commit", 3, (), {"orders": 4}, {"orders": {"batch_id": 3}}))
    assert decide(storage, Decision("set", 2, "commit", 3)) == first == read_decision(storage, "set", 2)
    with pytest.raises(RescaleDecided) as refused:
        decide(storage, Decision("set", 2, "abort"))
    assert refused.value.extra["outcome"] == "commit"
    assert decide(storage, Decision("set", 3, "abort")).outcome == "abort"  # another version, another record


def test_a_start_drops_what_a_commit_recorded_but_did_not_drop(tmp_path):
    """A replica that died after recording the new layout and before dropping what moved away drops
    it at its next start (RocksDB, in process: the crash is the catalog closed in between)."""

    (tmp_path / "data").mkdir()

    def open_replica() -> tuple[JobCatalog, CheckpointManager, RescaleParticipant]:
        layout = ReplicaLayout.open(str(tmp_path / "data"), count=2, index=1, set_id="s", adopt=False)
        topology = layout.topology
        store = RocksDBStore(str(tmp_path / "data"))
        catalog = JobCatalog(store, replica_index=topology.index, replica_count=topology.count, layout=layout)
        manager = CheckpointManager(catalog, LocalStorage(str(tmp_path / "checkpoints")))
        return catalog, manager, RescaleParticipant(catalog, manager)

    catalog, manager, participant = open_replica()
    job, _ = catalog.create(JOB, P)
    job.register_state(StateDescriptor(STATE, "value"))
    mine = [k for k in KEYS if owner(k, 2) == 1]
    with job.transaction() as tx:
        for key in mine:
            tx.value(STATE).update(key, 1)
    participant.prepare(2, 3, [])
    move = participant.layout.topology.move
    assert move is not None
    participant.layout.commit_move()  # the record of the commit, then the process dies
    manager.close()
    catalog.close()

    catalog, manager, participant = open_replica()
    try:
        assert participant.layout.topology.previous == Previous(2, 1, dropped=False)
        participant.resume_at_start()
        assert participant.layout.topology.previous == Previous(2, 1, dropped=True)
        job = catalog.get(JOB)
        stored = {kg for kg in range(P) for _ in job.partition.primaries_from(STATE, kg, None)}
        assert stored and stored <= set(range(64, 86))  # 86-127 moved to replica 2: dropped
        assert {key_group(k) for k in mine} > stored
    finally:
        manager.close()
        catalog.close()


# -- real servers: the raw endpoints ---------------------------------------------------------------------

JOB, STATE, P = "orders", "total", 128
KEYS = [f"user-{i}" for i in range(300)]


def key_group(key: str) -> int:
    return assign_to_key_group(key, "string", P)


def owner(key: str, count: int) -> int:
    return operator_index(P, count, key_group(key))


def key_in(start: int, end: int) -> str:
    """A key whose key group lies in [start, end]."""
    return next(k for k in (f"probe-{i}" for i in range(100_000)) if start <= key_group(k) <= end)


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def problem(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status and response.json()["code"] == code, response.text
    return response.json()


def step(url: str, name: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/topology/{name}", json=body, timeout=120)


def topology(url: str) -> dict:
    return ok(httpx.get(f"{url}/v1/topology", timeout=30))


def put(url: str, key: str, value: int) -> httpx.Response:
    ops = [{"op": "put", "state": STATE, "key": key, "value": value}]
    return httpx.post(f"{url}/v1/jobs/{JOB}/batch", json={"ops": ops}, timeout=30)


def write(urls: list[str], count: int, values: dict[str, int]) -> None:
    """Each key to its owner under ``count`` replicas, one batch per replica."""
    for index, url in enumerate(urls[:count]):
        ops = [
            {"op": "put", "state": STATE, "key": k, "value": v} for k, v in values.items() if owner(k, count) == index
        ]
        ok(httpx.post(f"{url}/v1/jobs/{JOB}/batch", json={"ops": ops}, timeout=30))


def read(urls: list[str], count: int, keys: list[str]) -> dict[str, int]:
    """The value of each of ``keys`` (those that have one), each read from its owner under ``count`` replicas."""
    found = {}
    for index, url in enumerate(urls[:count]):
        ops = [{"op": "get", "state": STATE, "key": k} for k in keys if owner(k, count) == index]
        results = ok(httpx.post(f"{url}/v1/jobs/{JOB}/batch", json={"ops": ops}, timeout=30))["results"]
        found.update({op["key"]: r["value"] for op, r in zip(ops, results, strict=True) if r["value"] is not None})
    return found


def create_job(urls: list[str]) -> None:
    for url in urls:
        ok(httpx.put(f"{url}/v1/jobs/{JOB}", json={"max_parallelism": P}, timeout=30), 201)
        ok(httpx.put(f"{url}/v1/jobs/{JOB}/states/{STATE}", json={"kind": "value"}, timeout=30), 201)


def checkpoint(urls: list[str], checkpoint_id: int) -> None:
    """One global checkpoint of the job: triggered everywhere, every upload awaited, completed everywhere."""
    base = f"/v1/jobs/{JOB}/checkpoints"
    for url in urls:
        ok(httpx.post(f"{url}{base}", json={"checkpoint_id": checkpoint_id}, timeout=30), 202)
    for url in urls:
        while (
            ok(httpx.get(f"{url}{base}/{checkpoint_id}", params={"wait_ms": 5000}, timeout=30))["status"]
            == "in_progress"
        ):
            pass
    for url in urls:
        ok(httpx.post(f"{url}{base}/{checkpoint_id}/complete", timeout=60))


def placed_right(urls: list[str], count: int) -> None:
    assert misplaced(urls, JOB, [STATE], P, count) == {STATE: []}


@pytest.fixture
def replica_set(tmp_path, backend):
    replicas = ReplicaSet(
        tmp_path, {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}, extra={"STATEHOUSE_BACKEND": backend}
    )
    yield replicas
    replicas.stop()


@pytest.mark.slow  # 40-70 s: three replica processes, checkpoints, restarts
def test_grow_two_to_three_then_shrink_back_through_the_raw_endpoints(replica_set):
    grow_and_shrink(replica_set)


@pytest.mark.slow  # 40-70 s: three replica processes, checkpoints, restarts
def test_grow_and_shrink_over_s3(tmp_path, s3_server, s3_location):
    storage = {"STATEHOUSE_CHECKPOINT_DIR": s3_location, "STATEHOUSE_S3_ENDPOINT_URL": s3_server.endpoint}
    replicas = ReplicaSet(tmp_path, storage)
    try:
        grow_and_shrink(replicas)
    finally:
        replicas.stop()


def grow_and_shrink(replica_set: ReplicaSet) -> None:
    """2 -> 3 -> 2 through the raw endpoints, every step checked, the oracle and placement after each."""
    urls = replica_set.start(2)
    create_job(urls)
    oracle = {k: i for i, k in enumerate(KEYS)}
    write(urls, 2, oracle)

    # An open epoch's staged write in a key group replica 1 gives away (86-127) holds the prepare off.
    staged = key_in(86, 127)
    ok(httpx.post(f"{urls[1]}/v1/jobs/{JOB}/fence", json={"epoch": 1}, timeout=30))
    body = {"ops": [{"op": "put", "state": STATE, "key": staged, "value": -1}], "epoch": 1}
    ok(httpx.post(f"{urls[1]}/v1/jobs/{JOB}/batch", json={**body, "partition": 0, "attempt": "a", "seq": 0}))
    refused = problem(step(urls[1], "prepare", version=2, replica_count=3), 409, "batch_in_flight")
    assert refused["job"] == JOB and topology(urls[1])["move"] is None
    winners = {"attempts": [{"partition": 0, "attempt": "a", "ops": 1}]}
    for phase in ("prepare", "commit"):
        ok(httpx.post(f"{urls[1]}/v1/jobs/{JOB}/epochs/1/{phase}", json=winners, timeout=30))
    oracle[staged] = -1

    urls = [*urls, replica_set.add(2, 3, version=2).url]
    for url in urls + urls[:1]:  # the same prepare twice changes nothing
        assert ok(step(url, "prepare", version=2, replica_count=3, replica_urls=urls))["move"]["version"] == 2
    moves = [topology(url)["move"] for url in urls]
    assert [m["frozen_key_groups"] for m in moves] == [{JOB: [[43, 63]]}, {JOB: [[86, 127]]}, {}]
    assert [m["joining"] for m in moves] == [False, False, True] and {m["phase"] for m in moves} == {"prepared"}
    assert [m["from_count"] for m in moves] == [2, 2, 0] and {tuple(m["replica_urls"]) for m in moves} == {tuple(urls)}
    problem(step(urls[0], "prepare", version=2, replica_count=4), 409, "rescale_pending")
    problem(httpx.get(f"{urls[2]}/readyz", timeout=30), 503, "not_ready")
    assert metric(urls[0], "statehouse_rescale_moves_in_progress") == 1

    # Between prepare and commit: writes into moving key groups wait (503), reads and the rest go on.
    moving, staying = key_in(86, 127), key_in(0, 42)
    frozen = put(urls[1], moving, 1)
    assert problem(frozen, 503, "rescale_in_progress")["topology_version"] == 2
    assert frozen.headers["Retry-After"] == "1" and frozen.json()["retry_after_ms"] == 200
    assert ok(httpx.get(f"{urls[1]}/v1/jobs/{JOB}/states/{STATE}/keys/{moving}", timeout=30))["value"] == oracle[moving]
    ok(put(urls[0], staying, 7))
    oracle[staying] = 7

    checkpoint(urls[:2], 1)
    problem(step(urls[0], "commit", version=2), 409, "rescale_not_decided")
    loads = [ok(step(url, "load", version=2, checkpoints={JOB: 1}))["jobs"] for url in urls]
    again = ok(step(urls[2], "load", version=2, checkpoints={JOB: 1}))["jobs"]
    assert again == loads[2] and loads[2][JOB]["key_groups"] == [[86, 127]] and loads[2][JOB]["entries"] > 0
    assert loads[1][JOB]["key_groups"] == [[43, 63]] and loads[0][JOB]["key_groups"] == []
    assert {topology(url)["move"]["phase"] for url in urls} == {"loaded"}
    # A client that learned v+1 from a replica that committed first meets one that has not: 503, retry.
    for url, key in ((urls[1], key_in(43, 63)), (urls[2], key_in(86, 127))):
        assert problem(put(url, key, 1), 503, "rescale_in_progress")["topology_version"] == 2

    anchor = {JOB: {"batch_id": 7}}  # kept for a coordinator that resumes the move
    decided = ok(step(urls[0], "decide", version=2, outcome="commit", checkpoints={JOB: 1}, metadata=anchor))
    assert decided["metadata"] == anchor
    assert ok(step(urls[1], "decide", version=2, outcome="commit")) == decided
    assert ok(httpx.get(f"{urls[2]}/v1/topology/decision", params={"version": 2}, timeout=30)) == decided
    problem(httpx.get(f"{urls[2]}/v1/topology/decision", params={"version": 9}, timeout=30), 404, "not_found")
    problem(step(urls[2], "abort", version=2), 409, "rescale_decided")
    for url in urls + urls[1:2]:  # commit again: done already
        after = ok(step(url, "commit", version=2))
        assert (after["version"], after["replica_count"], after["move"]) == (2, 3, None)
    assert topology(urls[1])["replica_urls"] == urls
    ok(httpx.get(f"{urls[2]}/readyz", timeout=30))
    # Loaded twice (the repeated load above): every byte read from storage counts.
    assert metric(urls[2], "statehouse_rescale_bytes_loaded_total") == 2 * loads[2][JOB]["bytes_read"] > 0
    assert metric(urls[2], "statehouse_rescale_duration_seconds_count") == 1
    assert metric(urls[0], "statehouse_rescale_moves_in_progress") == 0

    refused = problem(put(urls[1], moving, 1), 421, "key_not_owned")
    assert (refused["version"], refused["owner"]) == (2, 2)
    assert read(urls, 3, list(oracle)) == oracle
    placed_right(urls, 3)
    write(urls, 3, {moving: 11})
    oracle[moving] = 11

    # 3 -> 2: replica 2 gives everything away and is retired.
    for url in urls:
        ok(step(url, "prepare", version=3, replica_count=2, replica_urls=urls[:2]))
    assert topology(urls[2])["move"]["frozen_key_groups"] == {JOB: [[86, 127]]}
    checkpoint(urls, 2)
    for url in urls:
        ok(step(url, "load", version=3, checkpoints={JOB: 2}))
    # A commit decision names what it commits, completed: a forged one would wedge the set.
    assert problem(step(urls[1], "decide", version=3, outcome="commit", replica_count=2), 409, "rescale_incomplete")
    forged = step(urls[1], "decide", version=3, outcome="commit", replica_count=2, checkpoints={JOB: 99})
    assert "checkpoint 99" in problem(forged, 409, "rescale_incomplete")["detail"]
    ok(step(urls[1], "decide", version=3, outcome="commit", replica_count=2, checkpoints={JOB: 2}))
    for url in urls:
        ok(step(url, "commit", version=3))
    assert topology(urls[2])["retired"] and not topology(urls[0])["retired"]
    problem(httpx.get(f"{urls[2]}/readyz", timeout=30), 503, "not_ready")
    assert problem(put(urls[2], moving, 1), 421, "key_not_owned")["owner"] == 1
    assert read(urls, 2, list(oracle)) == oracle
    placed_right(urls, 2)  # replica 2 stores nothing


@pytest.mark.slow  # 40-70 s: three replica processes, checkpoints, restarts
def test_restarts_follow_the_decision_and_an_aborted_move_is_retried_at_the_next_version(tmp_path):
    """A replica killed before the decision stays frozen and an abort restores service; a new one
    killed before its load must load before it commits; one killed after the decision commit and
    before its own commit commits as it starts."""
    replicas = ReplicaSet(tmp_path, {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")})
    try:
        urls = replicas.start(2)
        create_job(urls)
        oracle = {k: i for i, k in enumerate(KEYS)}
        write(urls, 2, oracle)
        urls = [*urls, replicas.add(2, 3, version=2).url]
        for url in urls:
            ok(step(url, "prepare", version=2, replica_count=3))
        checkpoint(urls[:2], 1)
        for url in urls:
            ok(step(url, "load", version=2, checkpoints={JOB: 1}))

        # Killed before the decision: it comes back frozen (its record holds the move, undecided).
        replicas.restart(1)
        moving = key_in(86, 127)
        problem(put(urls[1], moving, 1), 503, "rescale_in_progress")
        assert topology(urls[1])["move"]["phase"] == "loaded"
        for url in urls:
            assert ok(step(url, "abort", version=2))["move"] is None
        ok(step(urls[0], "abort", version=2))  # again: nothing left to undo
        ok(put(urls[1], moving, 5))
        oracle[moving] = 5
        assert read(urls, 2, list(oracle)) == oracle
        placed_right(urls[:2], 2)
        assert ok(httpx.get(f"{urls[2]}/v1/jobs", timeout=30))["items"] == []  # the joining replica dropped its load

        # The decision of version 2 stands (abort): the next attempt takes version 3; the new,
        # empty replica accepts it as it is.
        problem(step(urls[0], "prepare", version=2, replica_count=3), 409, "rescale_decided")
        for url in urls:
            ok(step(url, "prepare", version=3, replica_count=3))
        checkpoint(urls[:2], 2)
        for url in urls[:2]:
            ok(step(url, "load", version=3, checkpoints={JOB: 2}))
        # The new replica killed before its load: it starts joining, and a commit waits for its load.
        replicas.restart(2)
        assert topology(urls[2])["move"]["joining"]
        ok(step(urls[1], "decide", version=3, outcome="commit", replica_count=3, checkpoints={JOB: 2}))
        problem(step(urls[2], "commit", version=3), 409, "rescale_not_loaded")
        ok(step(urls[2], "load", version=3, checkpoints={JOB: 2}))

        # Killed after the decision commit, before its own commit: the start commits it.
        replicas.restart(0)
        after = topology(urls[0])
        assert (after["version"], after["replica_count"], after["move"]) == (3, 3, None)
        for url in urls:
            ok(step(url, "commit", version=3))
        assert read(urls, 3, list(oracle)) == oracle
        placed_right(urls, 3)

        # Restarted with the environment of the layout before the move (not updated yet): the
        # recorded layout is served, and one warning line says what to set.
        replicas.restart(1)
        assert (topology(urls[1])["replica_count"], topology(urls[1])["version"]) == (3, 3)
        assert "set STATEHOUSE_REPLICA_COUNT=3 STATEHOUSE_TOPOLOGY_VERSION=3" in replicas.servers[1].log()
        assert read(urls, 3, list(oracle)) == oracle
    finally:
        replicas.stop()


def test_the_steps_need_an_admin_token(tmp_path):
    admin, user = "admin-secret", "user-secret"
    server = start_server(tmp_path, {"STATEHOUSE_BACKEND": "heap", "STATEHOUSE_API_TOKENS": f"{admin}:@admin,{user}"})
    try:
        bodies = {
            "prepare": {"version": 2, "replica_count": 1},
            "load": {"version": 2, "checkpoints": {}},
            "decide": {"version": 2, "outcome": "commit"},
            "commit": {"version": 2},
            "abort": {"version": 2},
        }
        as_user = {"Authorization": f"Bearer {user}"}
        for name, body in bodies.items():
            problem(
                httpx.post(f"{server.url}/v1/topology/{name}", json=body, headers=as_user, timeout=30), 403, "forbidden"
            )
        problem(
            httpx.get(f"{server.url}/v1/topology/decision", params={"version": 2}, headers=as_user), 403, "forbidden"
        )
        ok(httpx.get(f"{server.url}/v1/topology", headers=as_user, timeout=30))  # reading the layout needs no admin
        as_admin = {"Authorization": f"Bearer {admin}"}
        stray = {"version": 1, "outcome": "abort"}  # the version it serves: deciding it would spend it
        problem(httpx.post(f"{server.url}/v1/topology/decide", json=stray, headers=as_admin), 409, "rescale_conflict")
        ok(httpx.post(f"{server.url}/v1/topology/prepare", json=bodies["prepare"], headers=as_admin, timeout=30))
        bad = {"version": 2, "checkpoints": {"../elsewhere": 1}}  # a job name is a path in storage: checked first
        problem(
            httpx.post(f"{server.url}/v1/topology/load", json=bad, headers=as_admin, timeout=30), 422, "invalid_name"
        )
        ok(httpx.post(f"{server.url}/v1/topology/abort", json=bodies["abort"], headers=as_admin, timeout=30))
        decision = httpx.get(f"{server.url}/v1/topology/decision", params={"version": 2}, headers=as_admin, timeout=30)
        assert ok(decision)["outcome"] == "abort"
        problem(httpx.get(f"{server.url}/v1/topology/decision", params={"version": 2}), 401, "unauthorized")
    finally:
        server.stop()
