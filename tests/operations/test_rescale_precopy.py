"""A pre-copy move (docs/rescale.md, "Pre-copy"): the bulk of what moves is checkpointed and loaded
while writes go on, and at the cut only what changed since, from the old replicas' deltas.

Between the copy and the cut (the coordinator's ``copied`` step) every kind of change is made to
keys that move and keys that stay: values put and cleared, map entries put and removed, maps
cleared whole, lists appended and cleared, new keys, a state registered after the copy. Every key's
state afterwards equals an oracle kept in plain Python, every key lives on its owner only, and the
loads at the cut say what they took: only deltas when every old replica tracked its changes, the
key groups of an old replica that restarted mid-copy (its tracking gone) whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from statehouse.client import StatehouseClient, rescale
from statehouse.client.coordinator import CheckpointCoordinator
from statehouse.client.rescale import LiveRescale, RescaleReport
from tests.support.replica_set import ReplicaSet, misplaced

pytestmark = [pytest.mark.http, pytest.mark.slow]  # three replica processes, two moves

JOB = "precopied"
P = 64
KEYS = [f"user-{i}" for i in range(240)]
STATES = ["v", "l", "m", "late"]


@pytest.fixture(params=["rocksdb", "heap"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def replicas(tmp_path: Path, backend: str) -> Iterator[ReplicaSet]:
    replica_set = ReplicaSet(
        tmp_path / "replicas", {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}, backend=backend
    )
    try:
        yield replica_set
    finally:
        replica_set.stop()


class Oracle:
    """Every key's expected state, changed beside the replicas'."""

    def __init__(self) -> None:
        self.v: dict[str, int] = {}
        self.l: dict[str, list[int]] = {}
        self.m: dict[str, dict[str, int]] = {}
        self.late: dict[str, int] = {}

    def fill(self, sh: StatehouseClient) -> None:
        job = sh.create_job(JOB, P)
        job.register("v", "value")
        job.register("l", "list")
        job.register("m", "map")
        with job.batch() as batch:
            for i, key in enumerate(KEYS):
                batch.put("v", key, i)
                batch.add("l", key, i)
                for e in range(3):
                    batch.map_put("m", key, f"e{e}", i * 10 + e)
                self.v[key], self.l[key], self.m[key] = i, [i], {f"e{e}": i * 10 + e for e in range(3)}

    def change(self, sh: StatehouseClient, round_: int) -> None:
        """Every kind of change, over keys of every replica (so over moving ones too)."""
        job = sh.job(JOB)
        if round_ == 1:
            job.register("late", "value")  # a state, and its table, the copy does not have
        with job.batch() as batch:
            for i, key in enumerate(KEYS):
                kind = (i + round_) % 6
                if kind == 0:
                    batch.put("v", key, 1000 * round_ + i)
                    self.v[key] = 1000 * round_ + i
                elif kind == 1:
                    batch.clear("v", key)
                    self.v.pop(key, None)
                elif kind == 2:
                    batch.map_put("m", key, f"r{round_}", -i)
                    batch.map_remove("m", key, "e0")
                    self.m.setdefault(key, {})[f"r{round_}"] = -i
                    self.m[key].pop("e0", None)
                elif kind == 3:
                    batch.clear("m", key)
                    self.m.pop(key, None)
                elif kind == 4:
                    batch.add("l", key, round_)
                    self.l.setdefault(key, []).append(round_)
                else:
                    batch.clear("l", key)
                    self.l.pop(key, None)
                if i % 5 == 0:
                    batch.put("late", key, round_ * 7 + i)
                    self.late[key] = round_ * 7 + i
            for j in range(20):  # keys that did not exist at the copy
                key = f"new-{round_}-{j}"
                batch.put("v", key, j)
                self.v[key] = j

    def check(self, urls: list[str], count: int) -> None:
        keys = [*KEYS, *(f"new-{r}-{j}" for r in (1, 2, 3) for j in range(20))]
        with StatehouseClient(urls) as sh:
            job = sh.job(JOB)
            assert len(job.replicas) == count
            with job.batch() as batch:
                got = {key: (batch.get("v", key), batch.get("l", key), batch.get("late", key)) for key in keys}
            maps = job.map_state("m")
            seen = {
                key: (v.value, lst.value or [], maps.entries(key), late.value) for key, (v, lst, late) in got.items()
            }
        expected = {
            key: (self.v.get(key), self.l.get(key, []), self.m.get(key, {}), self.late.get(key)) for key in keys
        }
        wrong = {key: (seen[key], expected[key]) for key in keys if seen[key] != expected[key]}
        assert not wrong, f"{len(wrong)} keys differ (got, expected): {dict(list(wrong.items())[:5])}"
        assert misplaced(urls, JOB, STATES, P, count) == {state: [] for state in STATES}


def _move(
    sh: StatehouseClient, to: int, new: list[str], on_copied: Any, at: str = "copied"
) -> tuple[list[str], dict[str, Any]]:
    """The move, ``on_copied`` run once when the driver reports step ``at``."""
    steps: list[str] = []

    def progress(step: str, info: dict[str, Any]) -> None:
        steps.append(step)
        if step == at and steps.count(at) == 1:
            on_copied()

    with LiveRescale(sh, to, new, wait=120, progress=progress) as move:
        report = move.run()
    return steps, report.loaded


def test_the_cut_loads_only_what_changed_since_the_copy(replicas: ReplicaSet) -> None:
    urls = replicas.start(2)
    new = replicas.add(2, 3, version=2).url
    oracle = Oracle()
    with StatehouseClient(urls) as sh:
        oracle.fill(sh)
        steps, loaded = _move(sh, 3, [new], lambda: oracle.change(sh, 1))
    assert steps[:4] == ["copying", "caught up", "copied", "prepared"], steps
    # At the cut, nothing loaded whole: every moving key group came up to date by delta
    assert all(load["entries"] == 0 for load in loaded.values()), loaded
    assert sum(load["delta_keys"] for load in loaded.values()) > 0, loaded
    oracle.check([*urls, new], 3)

    with StatehouseClient([*urls, new]) as sh:
        steps, loaded = _move(sh, 2, [], lambda: oracle.change(sh, 2))
    assert all(load["entries"] == 0 for load in loaded.values()), loaded
    oracle.check(urls, 2)


def _move_changing_in_every_phase(
    sh: StatehouseClient, oracle: Oracle, new: str, between_rounds: Callable[[], None] = lambda: None
) -> tuple[RescaleReport, list[int]]:
    """A 2 -> 3 move with changes made as the copy is checkpointed (round 1 carries them), after
    round 1 (``between_rounds`` first; round 2) and after the last round (the cut); each round's keys."""
    rounds: list[int] = []

    def progress(step: str, info: dict[str, Any]) -> None:
        if step == "copying":
            oracle.change(sh, 1)
        elif step == "caught up":
            rounds.append(info["keys"])
            if info["round"] == 1:
                between_rounds()
                oracle.change(sh, 2)
        elif step == "copied":
            oracle.change(sh, 3)

    oracle.fill(sh)
    with LiveRescale(sh, 3, [new], wait=120, progress=progress) as move:
        return move.run(), rounds


def test_catch_up_rounds_carry_what_changed_during_the_copy_and_the_cut_only_the_rest(
    replicas: ReplicaSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Changes made as the copy is checkpointed go in catch-up round 1, changes made after it in
    round 2 (each written by the old replicas and applied by the new layout, writes going on),
    and what changes after the last round in the cut's delta; the state equals the oracle."""
    monkeypatch.setattr(rescale, "CATCH_UP_KEYS", 0)  # every round taken, as under a busy writer
    urls = replicas.start(2)
    new = replicas.add(2, 3, version=2).url
    oracle = Oracle()
    with StatehouseClient(urls) as sh:
        report, rounds = _move_changing_in_every_phase(sh, oracle, new)
    assert len(rounds) == rescale.CATCH_UP_ROUNDS and rounds[0] > 0 and rounds[1] > 0 and rounds[2] == 0, rounds
    assert all(load["entries"] == 0 for load in report.loaded.values()), report.loaded
    cut_keys = sum(load["delta_keys"] for load in report.loaded.values())
    assert 0 < cut_keys < rounds[0] + rounds[1], (cut_keys, rounds)
    oracle.check([*urls, new], 3)


@pytest.mark.parametrize("backend", ["rocksdb"])
@pytest.mark.parametrize("at", ["copied", "caught up"])
def test_a_job_made_during_the_copy_moves_whole(replicas: ReplicaSet, at: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job made after the copy's checkpoint (between catch-up rounds, or after the last) has no
    copy: the catch-up rounds pass it by, and the cut loads it whole."""
    monkeypatch.setattr(rescale, "CATCH_UP_KEYS", 0)  # a second round follows the first
    urls = replicas.start(2)
    new = replicas.add(2, 3, version=2).url
    oracle = Oracle()
    born = [f"born-{i}" for i in range(60)]

    def make_a_job() -> None:
        with StatehouseClient(urls) as writer:
            job = writer.create_job("born", P)
            job.register("v", "value")
            with job.batch() as batch:
                for i, key in enumerate(born):
                    batch.put("v", key, i)
            oracle.change(writer, 1)

    with StatehouseClient(urls) as sh:
        oracle.fill(sh)
        _move(sh, 3, [new], make_a_job, at)
    oracle.check([*urls, new], 3)
    with StatehouseClient([*urls, new]) as sh, sh.job("born").batch() as batch:
        got = {key: batch.get("v", key) for key in born}
    assert {key: answer.value for key, answer in got.items()} == {key: i for i, key in enumerate(born)}
    assert misplaced([*urls, new], "born", ["v"], P, 3) == {"v": []}


def test_an_old_replica_restarted_mid_copy_has_its_key_groups_loaded_whole(tmp_path: Path) -> None:
    replicas = ReplicaSet(tmp_path / "replicas", {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")})
    try:
        urls = replicas.start(2)
        new = replicas.add(2, 3, version=2).url
        oracle = Oracle()

        def restart_then_change() -> None:
            replicas.restart(0)  # its change tracking is gone: it writes no delta at the cut
            with StatehouseClient(urls) as writer:
                oracle.change(writer, 1)

        with StatehouseClient(urls) as sh:
            oracle.fill(sh)
            _steps, loaded = _move(sh, 3, [new], restart_then_change)
        # Replica 1 takes old replica 0's key groups: whole; replica 2 takes old replica 1's: by delta
        assert loaded[urls[1]]["entries"] > 0 and loaded[urls[1]]["delta_keys"] == 0, loaded
        assert loaded[new]["entries"] == 0 and loaded[new]["delta_keys"] > 0, loaded
        oracle.check([*urls, new], 3)
    finally:
        replicas.stop()


def test_an_old_replica_restarted_between_catch_up_rounds_has_its_share_loaded_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old replica 0 restarts after round 1 was applied: its tracker and token are gone, so it
    writes no later round and no delta at the cut; the share it gives away is loaded whole at the
    cut over what the rounds had applied, the other share by delta, and every key is exact."""
    monkeypatch.setattr(rescale, "CATCH_UP_KEYS", 0)
    replicas = ReplicaSet(tmp_path / "replicas", {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")})
    try:
        urls = replicas.start(2)
        new = replicas.add(2, 3, version=2).url
        oracle = Oracle()
        with StatehouseClient(urls) as sh:
            report, _rounds = _move_changing_in_every_phase(sh, oracle, new, lambda: replicas.restart(0))
        # Replica 1 takes old replica 0's key groups: whole; replica 2 takes old replica 1's: by delta
        assert report.loaded[urls[1]]["entries"] > 0 and report.loaded[urls[1]]["delta_keys"] == 0, report.loaded
        assert report.loaded[new]["entries"] == 0 and report.loaded[new]["delta_keys"] > 0, report.loaded
        oracle.check([*urls, new], 3)
    finally:
        replicas.stop()


class CoordinatorDied(Exception):
    pass


@pytest.mark.parametrize(("backend", "then"), [("rocksdb", "resume"), ("heap", "abort")])
def test_a_coordinator_dead_after_the_copy_leaves_writes_going_and_resume_or_abort_ends_it(
    replicas: ReplicaSet, then: str
) -> None:
    urls = replicas.start(2)
    new = replicas.add(2, 3, version=2).url
    oracle = Oracle()

    def die(step: str, info: dict[str, Any]) -> None:
        if step == "copied":
            raise CoordinatorDied

    with StatehouseClient(urls) as sh:
        oracle.fill(sh)
        with LiveRescale(sh, 3, [new], wait=120, progress=die) as move, pytest.raises(CoordinatorDied):
            move.run()
        shown = [httpx.get(f"{url}/v1/topology", timeout=10).json()["move"] for url in [*urls, new]]
        assert [m["phase"] for m in shown] == ["copying"] * 3
        assert all(m["frozen_key_groups"] == {} for m in shown)
        oracle.change(sh, 1)  # nothing is frozen: every key takes writes, none waits
        with LiveRescale(sh, 3, [new], wait=120) as move:
            report = move.resume() if then == "resume" else move.abort()
    if then == "resume":
        assert report.outcome == "committed"
        oracle.check([*urls, new], 3)
    else:
        assert report.outcome == "aborted"
        assert httpx.get(f"{new}/v1/topology", timeout=10).json()["unassigned"] is True
        oracle.check(urls, 2)


def test_checkpoints_taken_during_the_copy_leave_the_copys_checkpoint_in_place(tmp_path: Path, monkeypatch) -> None:
    """A query checkpoints after every micro-batch while the copy loads: with one checkpoint retained,
    each would subsume the copy's checkpoint; the move's checkpoints are held until it ends."""
    storage = {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    replicas = ReplicaSet(tmp_path / "replicas", storage, extra={"STATEHOUSE_NUM_RETAINED": "1"})
    original = LiveRescale._checkpoint
    queries: list[int] = []

    def checkpoint_then_the_querys(self: LiveRescale, move: Any) -> dict[str, int]:
        done = original(self, move)
        if not queries:  # the copy's: the query changes state and checkpoints before the copy is loaded
            with StatehouseClient(urls) as writer:
                oracle.change(writer, 1)
                queries.append(CheckpointCoordinator(writer.job(JOB)).checkpoint().checkpoint_id)
        return done

    monkeypatch.setattr(LiveRescale, "_checkpoint", checkpoint_then_the_querys)
    try:
        urls = replicas.start(2)
        new = replicas.add(2, 3, version=2).url
        oracle = Oracle()
        with StatehouseClient(urls) as sh:
            oracle.fill(sh)
            _steps, loaded = _move(sh, 3, [new], lambda: None)
        assert queries and all(load["entries"] == 0 for load in loaded.values()), loaded
        oracle.check([*urls, new], 3)
    finally:
        replicas.stop()
