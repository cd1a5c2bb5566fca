"""The client side of the live rescale (client/rescale.py, docs/operations.md "Rescaling")
over real RocksDB replicas sharing one checkpoint directory: LiveRescale 2 -> 3 -> 2 with a writer
running and every value checked against a dict; a coordinator that dies after each step (its
progress callback raises) replaced by a resume; an abort; and the per-process layout cache every new
client (each Spark task) routes from."""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from statehouse.client import ClientConfig, StatehouseClient, StatehouseError, cli
from statehouse.client.attempts import TaskAttempt
from statehouse.client.coordinator import (
    MOVE_POLL,
    MOVE_POLL_MAX,
    MOVE_POLL_STEADY,
    MicroBatchCoordinator,
    job_at_boundary,
    move_poll_pauses,
)
from statehouse.client.global_checkpoints import CheckpointCoordinator
from statehouse.client.rescale import STEPS, LiveRescale, RescaleFailed, RescaleReport
from tests.support.metrics import metric
from tests.support.replica_set import ReplicaSet, misplaced

pytestmark = [pytest.mark.http, pytest.mark.slow]  # replica sets moved by a coordinator

JOB = "moving"
P = 32
KEYS = [f"user-{i}" for i in range(120)]


class Died(Exception):
    """The coordinator 'dies' here: raised from the progress callback, nothing after it runs."""


def test_a_new_client_routes_from_the_layout_this_process_learned(two_replicas, job_name):
    urls = [two_replicas[1].url, two_replicas[0].url]  # any order: the cache holds the learned one
    with StatehouseClient(urls) as first:
        first.create_job(job_name, 16).register("s", "value").update("alice", 1)
        assert not first.replicas.cached
    with StatehouseClient(list(reversed(urls))) as second:
        job = second.job(job_name)  # no GET /v1/topology: the layout came from the cache
        assert second.replicas.cached and second.replicas.urls == [s.url for s in two_replicas]
        assert job.value_state("s").value("alice") == 1


@pytest.fixture
def replica_set(tmp_path) -> Iterator[ReplicaSet]:
    replicas = ReplicaSet(tmp_path, {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")})
    replicas.start(2)
    yield replicas
    replicas.stop()


@pytest.fixture
def oracle(replica_set) -> dict[str, tuple[int, list[int]]]:
    """The job with a value state and a list state written for every key; what they must hold."""
    expected: dict[str, tuple[int, list[int]]] = {}
    with StatehouseClient(replica_set.urls) as sh:
        job = sh.create_job(JOB, P)
        job.register("v", "value")
        job.register("l", "list")
        with job.batch() as batch:
            for i, key in enumerate(KEYS):
                batch.put("v", key, i)
                batch.add("l", key, i)
                expected[key] = (i, [i])
    return expected


def check(urls: list[str], expected: dict[str, tuple[int, list[int]]], count: int) -> None:
    """Every key's values through a fresh client, and every key stored on its owner only."""
    with StatehouseClient(urls) as sh:
        job = sh.job(JOB)
        assert len(job.replicas) == count
        with job.batch() as batch:
            got = {key: (batch.get("v", key), batch.get("l", key)) for key in KEYS}
        assert {key: (value.value, values.value) for key, (value, values) in got.items()} == expected
    assert misplaced(urls, JOB, ["v", "l"], P, count) == {"v": [], "l": []}


def grow(replica_set: ReplicaSet, version: int) -> str:
    """A new, empty replica 2 of 3 (a fresh data directory, even where a removed one ran)."""
    if len(replica_set.servers) > 2:
        removed = replica_set.servers.pop()
        removed.stop()
        removed.log_path.parent.rename(f"{removed.log_path.parent}-removed-v{version}")
    return replica_set.add(2, 3, version).url


def writer(urls: list[str], expected: dict[str, tuple[int, list[int]]], keys: list[str]) -> threading.Thread:
    """Writes while the move runs (a plain client's batches): each write to a frozen key group is
    refused 503 and retried until the commit, then re-routed on the 421 that follows."""

    def write() -> None:
        with StatehouseClient(urls) as sh:
            job = sh.job(JOB)
            for key in keys:
                later = 1000 + KEYS.index(key)
                with job.batch() as batch:
                    batch.put("v", key, later)
                    batch.add("l", key, later)
                expected[key] = (later, [*expected[key][1], later])

    return threading.Thread(target=write, daemon=True)


def test_live_rescale_2_to_3_to_2_with_a_writer_running(replica_set, oracle):
    urls = replica_set.urls
    new = grow(replica_set, 2)
    steps: list[str] = []
    writers: list[threading.Thread] = []

    def progress(step: str, info: dict[str, Any]) -> None:
        steps.append(step)
        if step == "prepared":  # frozen now: the writer's refused writes wait for the commit
            writers.append(writer(urls, oracle, KEYS[:40]))
            writers[-1].start()

    with StatehouseClient(urls) as sh, LiveRescale(sh, 3, [new], wait=120, progress=progress) as move:
        report = move.run()
        assert len(sh.replicas) == 3  # the driver's own client routes by the new layout
    for thread in writers:
        thread.join(120)
        assert not thread.is_alive()
    assert steps == list(STEPS) and report.outcome == "committed" and report.to_count == 3
    assert report.copied[new]["entries"] > 0 and report.copied[new]["bytes_read"] > 0  # the bulk, by the pre-copy
    assert report.ranges[JOB] == [[0, 10], [11, 21], [22, 31]]
    check([*urls, new], oracle, 3)

    with StatehouseClient(urls) as sh, LiveRescale(sh, 2, wait=120) as move:
        report = move.run()
    assert report.outcome == "committed" and report.version == 3 and report.urls == urls
    assert report.ranges[JOB] == [[0, 15], [16, 31]]
    check(urls, oracle, 2)


def run_until(urls: list[str], to: int, new: list[str], step: str) -> None:
    def progress(reached: str, _info: dict[str, Any]) -> None:
        if reached == step:
            raise Died(step)

    with (
        StatehouseClient(urls) as sh,
        LiveRescale(sh, to, new, wait=120, progress=progress) as move,
        pytest.raises(Died),
    ):
        move.run()


def resumed(urls: list[str]) -> RescaleReport:
    """Another coordinator, given only the old replicas' URLs (a new process would be the same:
    nothing of the dead one is kept), resumes: the replicas name the move's new set."""
    with StatehouseClient(urls) as sh, LiveRescale(sh, wait=120) as move:
        assert move.pending() in ("undecided", "commit")
        return move.resume()


@pytest.mark.slow  # eight moves: about two minutes
@pytest.mark.parametrize("step", ["prepared", "checkpointed", "loaded", "decided"])
def test_a_coordinator_dying_after_a_step_is_resumed(replica_set, oracle, step):
    urls = replica_set.urls
    new = grow(replica_set, 2)
    run_until(urls, 3, [new], step)
    report = resumed(urls)
    assert report.outcome == "committed" and report.to_count == 3
    check([*urls, new], oracle, 3)
    run_until(urls, 2, [], step)  # and back, dying at the same step
    report = resumed(urls)
    assert report.outcome == "committed" and report.to_count == 2
    check(urls, oracle, 2)


def test_a_coordinator_dying_once_every_old_replica_committed_is_resumed_for_the_joining_one(replica_set, oracle):
    """The old replicas committed (they no longer say the count the move started from), the joining
    one did not (its commit had not reached it): the decision record says where the move started."""
    urls = replica_set.urls
    new = grow(replica_set, 2)
    run_until(urls, 3, [new], "decided")
    for url in urls:  # as far as the dead coordinator got: every old replica committed, the new one not
        httpx.post(f"{url}/v1/topology/commit", json={"version": 2}, timeout=60).raise_for_status()
    assert [topology["move"] for topology in (httpx.get(f"{url}/v1/topology").json() for url in urls)] == [None, None]
    assert httpx.get(f"{new}/v1/topology").json()["move"]["joining"]
    report = resumed(urls)
    assert (report.outcome, report.from_count, report.to_count) == ("committed", 2, 3)
    check([*urls, new], oracle, 3)


def test_an_undecided_move_is_aborted_and_a_later_one_takes_the_next_version(replica_set, oracle, capsys):
    urls = replica_set.urls
    new = grow(replica_set, 2)
    run_until(urls, 3, [new], "loaded")
    assert cli.main(["status", "--urls", ",".join(urls), "--json"]) == 0  # the old layout, and the move
    shown = json.loads(capsys.readouterr().out)
    assert (shown["replica_count"], shown["move"]["replica_count"], shown["move"]["phase"]) == (2, 3, "loaded")
    with StatehouseClient(urls) as sh, LiveRescale(sh, wait=120) as move:  # the move names the new replica
        report = move.abort()
        assert report.outcome == "aborted" and move.pending() is None
    check(urls, oracle, 2)  # the old layout serves, nothing lost, nothing left on the new replica
    unassigned(replica_set, new)
    replica_set.restart(2)  # its record says so across a restart too
    unassigned(replica_set, new)
    with StatehouseClient(urls) as sh, LiveRescale(sh, 3, [new], wait=120) as move:
        report = move.run()  # version 2 was decided abort, written once: this move is version 3
    assert report.outcome == "committed" and report.version == 3
    assert not httpx.get(f"{new}/v1/topology").json()["unassigned"]
    check([*urls, new], oracle, 3)


def unassigned(replica_set: ReplicaSet, url: str) -> None:
    """The new replica of an aborted move: holds nothing, says it is unassigned, is not ready, is skipped
    by clients, and its log says what the operator does with it."""
    shown = httpx.get(f"{url}/v1/topology").json()
    assert (shown["jobs"], shown["move"], shown["unassigned"], shown["retired"]) == ([], None, True, False)
    ready = httpx.get(f"{url}/readyz")
    assert ready.status_code == 503 and "unassigned" in ready.json()["detail"], ready.text
    with StatehouseClient([*replica_set.urls[:2], url]) as sh:
        assert len(sh.replicas.learn()) == 2 and sh.replicas.urls == replica_set.urls[:2]  # the serving layout
    server = next(s for s in replica_set.servers if s.url == url)
    assert "unassigned: the live rescale that was to add this replica" in server.log_path.read_text()
    assert "stop it (delete the pod, stop the process)" in server.log_path.read_text()


def micro_batch(job, coordinator: MicroBatchCoordinator, batch_id: int, amount: int, totals: dict[str, int]) -> None:
    """One micro-batch: a task attempt adds ``amount`` to every key; the driver commits it."""
    plan = coordinator.begin(batch_id)
    attempt = TaskAttempt(plan.epoch, 0, len(job.replicas), unit="u", task=batch_id)
    with job.batch(attempt=attempt) as writes:
        for key in KEYS:
            writes.add("sum", key, amount)
    coordinator.commit(plan, [attempt.message()])
    for key in KEYS:
        totals[key] = totals.get(key, 0) + amount


def summed(sh: StatehouseClient, totals: dict[str, int]) -> Any:
    """The job with a sum state, its micro-batch 0 committed (1 added to every key)."""
    job = sh.create_job(JOB, P)
    job.register("sum", "reducing", function="sum")
    micro_batch(job, MicroBatchCoordinator(job), 0, 1, totals)
    return job


def sums(job) -> dict[str, int]:
    with job.batch() as reads:
        pending = {key: reads.get("sum", key) for key in KEYS}
    return {key: p.value for key, p in pending.items()}


def test_a_driver_rescales_between_micro_batches_and_a_restarted_one_recovers(replica_set):
    urls = replica_set.urls
    totals: dict[str, int] = {}
    with StatehouseClient(urls) as sh:
        job = sh.create_job(JOB, P)
        job.register("sum", "reducing", function="sum")
        coordinator = MicroBatchCoordinator(job)
        micro_batch(job, coordinator, 0, 1, totals)
        open_plan = coordinator.begin(1)
        with pytest.raises(StatehouseError, match="micro-batch 1 is open: rescale between micro-batches"):
            coordinator.rescale(3, [grow(replica_set, 2)])
        coordinator.commit(open_plan, [])  # an empty batch 1
        report = coordinator.rescale(3, [replica_set.urls[2]], wait=120)
        assert report.outcome == "committed" and len(job.replicas) == 3
        assert coordinator.applied().batch_id == 1  # the batch moved with the state
        micro_batch(job, coordinator, 2, 10, totals)  # runs on the new layout
        assert coordinator.begin(2).replay  # a replay of the batch before is answered on it too
        assert sums(job) == totals

        # The driver dies once commit is decided (before any replica committed); a new one recovers.
        def die(step: str, _info: dict[str, Any]) -> None:
            if step == "decided":
                raise Died(step)

        with pytest.raises(Died):
            coordinator.rescale(2, progress=die, wait=120)
    with StatehouseClient(urls) as sh:
        job = sh.job(JOB)  # the old layout (3) still serves: the move is decided, not applied
        coordinator = MicroBatchCoordinator(job)
        coordinator.recover()
        assert len(job.replicas) == 2 and job.replicas.version == 3
        micro_batch(job, coordinator, 3, 100, totals)
        assert sums(job) == totals
    assert misplaced(urls, JOB, ["sum"], P, 2) == {"sum": []}

    # The driver dies once every replica committed: the batch the state holds moved with it.
    with StatehouseClient(urls) as sh:
        coordinator = MicroBatchCoordinator(sh.job(JOB))

        def late(step: str, _info: dict[str, Any]) -> None:
            if step == "committed":
                raise Died(step)

        with pytest.raises(Died):
            coordinator.rescale(3, [grow(replica_set, 4)], progress=late, wait=120)
    with StatehouseClient(urls) as sh:
        job = sh.job(JOB)
        coordinator = MicroBatchCoordinator(job)
        coordinator.recover()  # nothing pending
        assert len(job.replicas) == 3 and coordinator.applied().batch_id == 3
        micro_batch(job, coordinator, 4, 1000, totals)
        assert sums(job) == totals


def test_the_batch_after_an_operators_move_finds_its_restore_point_in_one_listing(replica_set):
    """Right after a move the new layout has no checkpoint, and each replica reads storage to list
    its own: the next micro-batch's begin (a new coordinator, as foreachBatch makes each batch)
    finds the move's checkpoint, which holds the epoch the state holds, in one listing of every
    layout's per replica, and takes no checkpoint of its own before its writes."""
    urls = replica_set.urls
    totals: dict[str, int] = {}
    with StatehouseClient(urls) as sh:
        job = summed(sh, totals)
        new = grow(replica_set, 2)
        with StatehouseClient(urls) as operator, LiveRescale(operator, 3, [new], wait=120) as move:
            assert move.run().outcome == "committed"
        route = 'route="/v1/jobs/{job}/checkpoints",status="200"}'
        listed, triggered = (f'statehouse_http_requests_total{{method="{m}",{route}' for m in ("GET", "POST"))

        def counts() -> list[tuple[float, float]]:
            return [(metric(url, listed), metric(url, triggered)) for url in replica_set.urls]

        before = counts()
        coordinator = MicroBatchCoordinator(job)
        plan = coordinator.begin(1)  # the driver's client still routes by the layout before the move
        assert len(job.replicas) == 3 and not plan.replay
        assert [(g - g0, p - p0) for (g, p), (g0, p0) in zip(counts(), before, strict=True)] == [(1, 0)] * 3
        attempt = TaskAttempt(plan.epoch, 0, len(job.replicas), unit="u", task=1)
        with job.batch(attempt=attempt) as writes:
            for key in KEYS:
                writes.add("sum", key, 10)
        coordinator.commit(plan, [attempt.message()])
        assert sums(job) == {key: totals[key] + 10 for key in KEYS}


def test_a_batch_waiting_for_a_move_looks_at_a_steady_pace_then_less_often():
    """A cut is frozen a second or less: a waiting batch looks every MOVE_POLL for the first
    MOVE_POLL_STEADY looks, so it goes on within one pause of the commit; a move left pending
    longer is looked at less and less often, at most once a second."""
    pauses = list(itertools.islice(move_poll_pauses(), MOVE_POLL_STEADY + 20))
    assert pauses[:MOVE_POLL_STEADY] == [MOVE_POLL] * MOVE_POLL_STEADY
    later = pauses[MOVE_POLL_STEADY:]
    assert later[0] > MOVE_POLL and later == sorted(later) and later[-1] == MOVE_POLL_MAX


def test_a_recovering_driver_aborts_only_its_own_undecided_move_and_waits_for_an_operators(replica_set, caplog):
    """Moves carry their initiator: a driver's recover() aborts the undecided move its dead
    predecessor started, leaves an operator's alone, and its next batch waits at its boundary for
    the operator's move (here: aborted by the operator while it waits)."""
    urls = replica_set.urls
    totals: dict[str, int] = {}
    with StatehouseClient(urls) as sh:
        job = summed(sh, totals)
    new = grow(replica_set, 2)
    run_until(urls, 3, [new], "prepared")  # an operator's move, its command dead
    with StatehouseClient(urls) as sh:
        job = sh.job(JOB)
        coordinator = MicroBatchCoordinator(job, move_wait=60)
        coordinator.recover()
        with LiveRescale(sh, wait=120) as move:
            assert (move.pending(), move.pending_initiator()) == ("undecided", "operator")  # left alone

        def operator_aborts() -> None:  # once the batch waits for the move
            deadline = time.monotonic() + 60
            while "waits for a live rescale" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
            with StatehouseClient(urls) as other, LiveRescale(other, wait=120) as move:
                move.abort()

        operator = threading.Thread(target=operator_aborts, daemon=True)
        with caplog.at_level("WARNING", logger="statehouse.client.coordinator"):
            operator.start()
            micro_batch(job, coordinator, 1, 10, totals)  # waits for the move, then runs
        operator.join(60)
        assert "micro-batch 1 of job 'moving' waits for a live rescale to 3 replicas" in caplog.text
        assert "started by operator" in caplog.text
        assert len(job.replicas) == 2 and sums(job) == totals

        def die(step: str, _info: dict[str, Any]) -> None:
            if step == "prepared":
                raise Died(step)

        with pytest.raises(Died):  # the driver's own move, the driver dead after its prepare
            coordinator.rescale(3, [grow(replica_set, 3)], progress=die, wait=120)  # version 2 was spent
    with StatehouseClient(urls) as sh:
        job = sh.job(JOB)
        coordinator = MicroBatchCoordinator(job)
        with LiveRescale(sh, wait=120) as move:
            assert move.pending_initiator() == f"query:{JOB}"
        coordinator.recover()  # its own: aborted
        with LiveRescale(sh, wait=120) as move:
            assert move.pending() is None
        micro_batch(job, coordinator, 2, 100, totals)
        assert sums(job) == totals and coordinator.applied().batch_id == 2


@pytest.mark.slow  # two moves and two restarts: about two minutes
@pytest.mark.parametrize("step", ["prepared", "loaded"])
def test_a_new_replica_killed_mid_move_is_waited_for_and_the_move_completes(replica_set, oracle, step):
    """SIGKILL and restart (same port and disk) of the new replica after a step: the driver asks it
    again until it answers, loads it again if it lost its load, and the move completes."""
    urls = replica_set.urls
    new = grow(replica_set, 2)

    def progress(reached: str, _info: dict[str, Any]) -> None:
        if reached == step:
            replica_set.restart(2)

    with StatehouseClient(urls) as sh, LiveRescale(sh, 3, [new], wait=120, progress=progress) as move:
        report = move.run()
    assert report.outcome == "committed"
    check([*urls, new], oracle, 3)


def test_a_micro_batch_beginning_while_a_committed_moves_joining_replica_is_down_waits_for_it(replica_set, caplog):
    """An operator's grow is decided and the old replicas have committed, but the joining replica died
    before it did: a micro-batch beginning then, as ``exactly_once`` begins one (a fresh client, the
    job's lookup on every replica, then ``begin``), waits for the joining replica instead of failing on
    the lookup, and runs on the three replicas once the restarted one has committed itself."""
    totals: dict[str, int] = {}
    seeds = replica_set.urls
    with StatehouseClient(seeds) as sh:
        summed(sh, totals)
    joining = grow(replica_set, 2)

    def die(step: str, _info: dict[str, Any]) -> None:
        if step == "decided":
            replica_set.servers[2].stop(signal.SIGKILL)

    # No transport retries: a request to the dead replica fails at once (what is tested is the wait after).
    quick = ClientConfig.of(seeds, retries=0)
    with (
        StatehouseClient(quick) as operator,
        LiveRescale(operator, 3, [joining], wait=1, progress=die) as move,
        pytest.raises(RescaleFailed, match="did not commit"),
    ):
        move.run()
    assert [httpx.get(f"{url}/v1/topology").json()["replica_count"] for url in seeds] == [3, 3]

    ran: list[int] = []

    def next_batch() -> None:
        with StatehouseClient(quick) as client:
            batch_job = job_at_boundary(client, JOB, "micro-batch 1 of job 'moving'", wait=60)
            micro_batch(batch_job, MicroBatchCoordinator(batch_job, move_wait=60), 1, 2, totals)
            ran.append(len(batch_job.replicas))

    with caplog.at_level("WARNING", logger="statehouse.client.coordinator"):
        batch = threading.Thread(target=next_batch, daemon=True)
        batch.start()
        deadline = time.monotonic() + 30
        while "micro-batch 1 of job 'moving' waits for a replica" not in caplog.text:
            assert batch.is_alive() and time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
        replica_set.restart(2)  # in place: it reads the decision and commits itself
        batch.join(60)
    assert ran == [3]
    with StatehouseClient(seeds) as sh:
        assert sums(sh.job(JOB)) == totals


def table_bytes(server) -> int:
    """The bytes of a replica's RocksDB table files (what its checkpoints upload)."""
    return sum(f.stat().st_size for f in (server.log_path.parent / "data").rglob("*.sst"))


def test_what_a_commit_dropped_is_compacted_away_later_and_at_shutdown(tmp_path):
    """STATEHOUSE_RESCALE_RECLAIM_DELAY_S: after a grow's commit, a staying replica's table files still
    hold the key groups it gave away (dropped: nothing reads them), so the first checkpoints on the new
    layout reuse them; the compaction that frees them runs after the delay, or at once at shutdown."""
    settings = {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "STATEHOUSE_RESCALE_RECLAIM_DELAY_S": "600"}
    replicas = ReplicaSet(tmp_path, settings)
    try:
        urls = replicas.start(2)
        keys = [f"user-{i}" for i in range(30_000)]
        with StatehouseClient(urls) as sh:
            job = sh.create_job(JOB, P)
            job.register("v", "value")
            for start in range(0, len(keys), 10_000):
                job.columns().put("v", keys[start : start + 10_000], [os.urandom(100).hex() for _ in range(10_000)])
            sh.create_job("deleted-after", P).register("v", "value").update("a", 1)
        joining = grow(replicas, 2)
        with StatehouseClient(urls) as sh, LiveRescale(sh, 3, [joining], wait=120) as move:
            assert move.run().outcome == "committed"  # its checkpoint flushed every table into files
        staying = replicas.servers[0]
        held = table_bytes(staying)
        assert held > 1_000_000, held
        assert misplaced([*urls, joining], JOB, ["v"], P, count=3) == {"v": []}  # dropped: not read
        assert table_bytes(staying) >= 0.95 * held  # still in its files
        assert httpx.delete(f"{staying.url}/v1/jobs/deleted-after").status_code == 204  # nothing to compact
        staying.stop()  # SIGTERM: the shutdown compacts them away
        assert table_bytes(staying) < 0.8 * held  # a third of its key groups went
        assert "Traceback" not in staying.log() and "failed" not in staying.log(), staying.log()[-3000:]
        assert "compacted away what the last live rescale moved off this replica (" in staying.log()
    finally:
        replicas.stop()


def test_a_batch_checkpoint_a_moves_copy_subsumed_is_taken_again_at_once(replica_set, monkeypatch, caplog):
    """An operator's move starts as a micro-batch commits: the move's copy checkpoint completes while
    the batch's own is still pending, and subsumes (aborts) it on the replicas. Nothing is frozen
    while a move copies and the layout is the batch's, so the batch takes its checkpoint again at
    once, and goes on: it does not wait for the move to end (here it never does: its coordinator died
    after the copy; the batch's bound on that wait is 5 s)."""
    totals: dict[str, int] = {}
    joining = grow(replica_set, 2)
    original = CheckpointCoordinator._triggered
    moves: list[str] = []

    def copy_after_the_trigger(self: CheckpointCoordinator, checkpoint_id, body):
        triggered = original(self, checkpoint_id, body)
        if body.get("metadata", {}).get("batch_id") == 1 and not moves:
            moves.append("started")  # the operator's move, its copy's checkpoint before the batch's completes

            def die(step: str, _info: dict[str, Any]) -> None:
                if step == "copied":
                    raise Died(step)

            with (
                StatehouseClient(replica_set.urls[:2]) as operator,
                pytest.raises(Died),
                LiveRescale(operator, 3, [joining], wait=120, progress=die) as move,
            ):
                move.run()
        return triggered

    monkeypatch.setattr(CheckpointCoordinator, "_triggered", copy_after_the_trigger)
    with StatehouseClient(replica_set.urls[:2]) as sh:
        job = sh.create_job(JOB, P)
        job.register("sum", "reducing", function="sum")
        coordinator = MicroBatchCoordinator(job, move_wait=5)
        micro_batch(job, coordinator, 0, 1, totals)
        with caplog.at_level("WARNING", logger="statehouse.client.coordinator"):
            micro_batch(job, coordinator, 1, 10, totals)
        assert moves == ["started"]
        assert "the checkpoint of micro-batch 1 met a live rescale's copy" in caplog.text, caplog.text
        assert coordinator.completed()[-1].metadata["batch_id"] == 1
        assert sums(job) == totals
        shown = [httpx.get(f"{url}/v1/topology", timeout=10).json()["move"] for url in replica_set.urls]
        assert [m["phase"] for m in shown] == ["copying"] * 3  # the move still pending: the batch did not wait
