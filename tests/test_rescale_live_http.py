"""The server side of a live rescale (RESCALE.md, issue 30): the move recorded in each replica's
topology, the durable decision, and the steps prepare / load / decide / commit / abort over HTTP.

In process first (the record, the ranges, the decision, the restart rules), then real servers
(both backends) driven through the raw endpoints: every key equal to a dict oracle and stored only
on its owner, writes to moving key groups 503 between prepare and commit and 421 with v+1 after,
restarts on either side of the decision.
"""

from __future__ import annotations

import json

import pytest

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
from statehouse.checkpointing.decision import Decision, RescaleDecided, decide, read_decision
from statehouse.keygroups import KeyGroupRange
from statehouse.snapshots.storage.local import LocalStorage

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
    first = decide(storage, Decision("set", 2, "commit", 3, (), {"orders": 4}))
    assert decide(storage, Decision("set", 2, "commit", 3)) == first == read_decision(storage, "set", 2)
    with pytest.raises(RescaleDecided) as refused:
        decide(storage, Decision("set", 2, "abort"))
    assert refused.value.extra["outcome"] == "commit"
    assert decide(storage, Decision("set", 3, "abort")).outcome == "abort"  # another version, another record
