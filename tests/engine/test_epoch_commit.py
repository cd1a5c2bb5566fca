"""The epoch commit on both backends: it takes the winning attempts' views when that is exactly
what replaying their logs would write, and replays otherwise — each case checked for its
result and for the path it took."""

import pyarrow as pa
import pytest

from statehouse.backends import attempts
from statehouse.backends.attempts import commit, perform, prepare
from statehouse.backends.columns import ColumnOp
from statehouse.backends.ops import BatchOps
from statehouse.backends.staging import AttemptRef, Winner
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.ttl import TtlConfig


@pytest.fixture
def replays(monkeypatch):
    """How many attempts the commit replayed (0: it took the views)."""
    count = {"n": 0}
    replay = attempts._replay

    def counting(tx, staged):
        count["n"] += 1
        replay(tx, staged)

    monkeypatch.setattr(attempts, "_replay", counting)
    return count


def stage(job, epoch, partition, attempt, keys, values, state="s"):
    op = ColumnOp.parse(state, "add", pa.table({"key": keys, "value": values}))
    perform(job, op, epoch=epoch, attempt=AttemptRef(partition, attempt, 0))
    return Winner(partition, attempt, len(keys))


def commit_all(job, epoch, winners):
    prepare(job, epoch, winners)
    return commit(job, epoch, winners)


def totals(job, *keys, state="s"):
    with job.transaction() as tx:
        return [tx.reducing(state).get(k) for k in keys]


@pytest.fixture
def sums(job):
    job.register_state(StateDescriptor("s", "reducing", function="sum"))
    perform(job, BatchOps([{"op": "add", "state": "s", "key": "a", "value": 100}]))
    job.fence(1)
    return job


def test_disjoint_winners_commit_their_views(sums, replays):
    winners = [stage(sums, 1, 0, "t0", ["a", "b", "a"], [1, 2, 3]), stage(sums, 1, 1, "t1", ["c"], [4])]
    stage(sums, 1, 1, "t1-loser", ["a"], [1000])  # a losing attempt's writes never count
    assert commit_all(sums, 1, winners).ops == 4
    assert replays["n"] == 0
    assert totals(sums, "a", "b", "c") == [104, 2, 4]
    assert sums.committed_epoch == 1


def test_two_winners_on_one_key_are_replayed_and_both_count(sums, replays):
    winners = [stage(sums, 1, 0, "t0", ["a", "b"], [1, 2]), stage(sums, 1, 1, "t1", ["a"], [10])]
    commit_all(sums, 1, winners)
    assert replays["n"] == 2
    assert totals(sums, "a", "b") == [111, 2]


def test_a_direct_write_during_the_epoch_makes_the_commit_replay(sums, replays):
    winners = [stage(sums, 1, 0, "t0", ["a"], [1])]
    perform(sums, BatchOps([{"op": "add", "state": "s", "key": "a", "value": 50}]))  # not fenced, not staged
    commit_all(sums, 1, winners)
    assert replays["n"] == 1
    assert totals(sums, "a") == [151]  # the view alone would say 101


def test_a_registration_during_the_epoch_makes_the_commit_replay(sums, replays):
    winners = [stage(sums, 1, 0, "t0", ["a"], [1])]
    sums.register_state(StateDescriptor("other", "value"))
    commit_all(sums, 1, winners)
    assert replays["n"] == 1
    assert totals(sums, "a") == [101]


def test_ttl_states_are_replayed(job, replays):
    job.register_state(StateDescriptor("s", "reducing", function="sum", ttl=TtlConfig(60_000)))
    job.fence(1)
    commit_all(job, 1, [stage(job, 1, 0, "t0", ["a", "a"], [1, 2])])
    assert replays["n"] == 1
    assert totals(job, "a") == [3]


def test_batches_maps_and_lists_commit_their_views(job, replays):
    job.register_state(StateDescriptor("m", "map", function="sum"))
    job.register_state(StateDescriptor("l", "list"))
    perform(job, BatchOps([{"op": "map_put", "state": "m", "key": "u", "user_key": "x", "value": 5}]))
    job.fence(1)
    ops = [
        {"op": "map_add", "state": "m", "key": "u", "user_key": "x", "value": 1},
        {"op": "map_add", "state": "m", "key": "u", "user_key": "y", "value": 2},
        {"op": "add", "state": "l", "key": "u", "values": [1, 2]},
        {"op": "put", "state": "m", "key": "v", "value": {"z": 9}},
    ]
    perform(job, BatchOps(ops), epoch=1, attempt=AttemptRef(0, "t0", 0))
    commit_all(job, 1, [Winner(0, "t0", 4)])
    assert replays["n"] == 0
    with job.transaction() as tx:
        assert tx.map("m").get_all("u") == {"x": 6, "y": 2}
        assert tx.map("m").get_all("v") == {"z": 9}
        assert tx.list("l").get("u") == [1, 2]


def test_three_winners_overlapping_first_and_last_are_replayed(sums, replays):
    winners = [stage(sums, 1, p, f"t{p}", [key], [10**p]) for p, key in enumerate(["a", "b", "a"])]
    commit_all(sums, 1, winners)
    assert replays["n"] == 3
    assert totals(sums, "a", "b") == [201, 10]


def test_winners_of_several_requests_commit_their_views_when_disjoint(sums, replays):
    # The second request of an attempt makes its view's rows a dict of changes.
    for seq, keys in enumerate((["a", "b"], ["b", "c"])):
        op = ColumnOp.parse("s", "add", pa.table({"key": keys, "value": [1, 1]}))
        perform(sums, op, epoch=1, attempt=AttemptRef(0, "t0", seq))
    winners = [Winner(0, "t0", 4), stage(sums, 1, 1, "t1", ["d"], [7])]
    commit_all(sums, 1, winners)
    assert replays["n"] == 0
    assert totals(sums, "a", "b", "c", "d") == [101, 2, 1, 7]


def test_two_winners_on_one_map_key_are_replayed(job, replays):
    job.register_state(StateDescriptor("m", "map", function="sum"))
    job.fence(1)
    for partition in (0, 1):
        op = {"op": "map_add", "state": "m", "key": "u", "user_key": f"x{partition}", "value": 1}
        perform(job, BatchOps([op]), epoch=1, attempt=AttemptRef(partition, f"t{partition}", 0))
    commit_all(job, 1, [Winner(0, "t0", 1), Winner(1, "t1", 1)])
    assert replays["n"] == 2  # the check is per key (a map), not per entry
    with job.transaction() as tx:
        assert tx.map("m").get_all("u") == {"x0": 1, "x1": 1}


def stage_add_get(job, epoch, partition, attempt, keys, values, seq=0):
    op = ColumnOp.parse("s", "add_get", pa.table({"key": keys, "value": values}))
    return perform(job, op, epoch=epoch, attempt=AttemptRef(partition, attempt, seq)).to_pylist()


def test_a_staged_add_get_answers_the_committed_value_with_its_own_attempts_adds(sums, replays):
    """What a staged ``add_get`` answers is what the key holds once the epoch commits with this
    attempt winning (the committed value folded with this attempt's own staged adds, no other
    attempt's); a re-sent request answers the same again, a retried attempt starts from the
    committed value, and only the winner's adds commit."""
    assert stage_add_get(sums, 1, 0, "t0", ["a", "b", "a"], [1, 2, 3]) == [101, 2, 104]
    assert stage_add_get(sums, 1, 0, "t0", ["a", "b", "a"], [1, 2, 3]) == [101, 2, 104]  # re-sent: answered, once
    assert stage_add_get(sums, 1, 0, "t0", ["a"], [5], seq=1) == [109]  # its own earlier adds
    # The task failed; its retry sees none of the failed attempt's adds, only the committed 100.
    assert stage_add_get(sums, 1, 0, "t0-retry", ["a", "b", "a"], [1, 2, 3]) == [101, 2, 104]
    assert stage_add_get(sums, 1, 1, "t1", ["c"], [7]) == [7]
    commit_all(sums, 1, [Winner(0, "t0-retry", 3), Winner(1, "t1", 1)])
    assert replays["n"] == 0  # disjoint winners: their views, which hold what they answered
    assert totals(sums, "a", "b", "c") == [104, 2, 7]
    sums.fence(2)
    assert stage_add_get(sums, 2, 0, "u0", ["a"], [1]) == [105]  # the next epoch starts from the commit


def test_add_get_replays_like_add_when_winners_share_a_key(sums, replays):
    """Two winners adding to one key each answered their own view; the commit replays both."""
    assert stage_add_get(sums, 1, 0, "t0", ["a"], [1]) == [101]
    assert stage_add_get(sums, 1, 1, "t1", ["a"], [10]) == [110]
    commit_all(sums, 1, [Winner(0, "t0", 1), Winner(1, "t1", 1)])
    assert replays["n"] == 2
    assert totals(sums, "a") == [111]


def test_a_commit_without_prepare_checks_what_prepare_would_and_applies_all_or_nothing(sums, replays):
    """A deployment of one replica commits in one phase (client/coordinator.py): the commit alone
    must refuse what the prepare refuses, applying nothing, and apply once what it accepts."""
    from statehouse.protocol.errors import StateError

    winners = [stage(sums, 1, 0, "t0", ["a", "b"], [1, 2]), stage(sums, 1, 1, "t1", ["c"], [4])]
    missing = [*winners, Winner(2, "t2", 1)]  # a winner this replica never staged (it restarted)
    with pytest.raises(StateError) as lost:
        commit(sums, 1, missing)
    assert lost.value.code == "attempt_lost"
    short = [Winner(0, "t0", 1), winners[1]]  # a winner that reported fewer writes than were staged
    with pytest.raises(StateError) as miscounted:
        commit(sums, 1, short)
    assert miscounted.value.code == "attempt_lost"
    assert totals(sums, "a", "b", "c") == [100, None, None]  # nothing applied
    assert commit(sums, 1, winners).ops == 3
    assert commit(sums, 1, winners).ops == 0  # a re-sent commit: done already, not applied again
    assert totals(sums, "a", "b", "c") == [101, 2, 4]
    with pytest.raises(StateError) as stale:
        commit(sums, 0, winners)  # an epoch fenced off
    assert stale.value.code == "stale_epoch"
