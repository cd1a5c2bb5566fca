"""Timers (backends/timers.py) on both backends: order, dedupe, delete, firing on watermark and
processing-time advance, listing, fencing and task attempts, snapshots, restore and rescale."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from statehouse.backends import attempts
from statehouse.backends.errors import AttemptConflict, KeyNotOwned, StaleEpoch
from statehouse.backends.ops import BatchOps
from statehouse.backends.reserved import TIMER_TABLES, keyed_tables
from statehouse.backends.staging import AttemptRef, Winner
from statehouse.backends.timers import count_timers, list_timers
from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.keygroups import KeyGroupRange, assign_to_key_group, operator_index
from statehouse.snapshots.storage import open_storage
from tests.support.job_contents import global_checkpoint
from tests.support.server import start_server

pytestmark = [pytest.mark.http]


def fire(job, to, domain="event", **kwargs):
    """Advance directly; the fired timers as (timestamp, key, ns)."""
    result = attempts.advance(job, domain, to, **kwargs)
    return [(t.timestamp, t.key, t.namespace) for t in result.timers]


def register(job, *timers, domain="event", key_type="string"):
    with job.transaction() as tx:
        for ts, key, *ns in timers:
            tx.timers.register(domain, key, ts, ns[0] if ns else "", key_type)


def owned(job, keys, key_type="string"):
    return [k for k in keys if assign_to_key_group(k, key_type, job.max_parallelism) in job.key_group_range]


# -- the timer service ---------------------------------------------------------------------------


def test_fire_in_order_deduped(job):
    register(job, (30, "b"), (10, "a"), (20, "c", "w1"), (10, "a"), (20, "c", "w1"), (20, "c", "w2"), (5, "z"))
    assert count_timers(job, "event") and sum(count_timers(job, "event").values()) == 5  # (10, a) and (20, c, w1) once
    assert fire(job, 4) == []
    fired = fire(job, 20)
    assert [ts for ts, _k, _ns in fired] == [5, 10, 20, 20]
    assert set(fired) == {(5, "z", ""), (10, "a", ""), (20, "c", "w1"), (20, "c", "w2")}
    assert fire(job, 20) == []  # fired timers are gone
    assert fire(job, 100) == [(30, "b", "")]
    assert sum(count_timers(job, "event").values()) == 0


def test_firing_order_is_timestamp_key_group_key_namespace(job):
    keys = [f"k{i}" for i in range(200)]
    register(job, *[(1_000 - i % 7, k, ns) for i, k in enumerate(keys) for ns in ("x", "a")])
    result = attempts.advance(job, "event", 10_000)
    order = [(t.timestamp, t.key_group) for t in result.timers]
    assert order == sorted(order) and len(order) == 400
    for t in result.timers:
        assert t.key_group == assign_to_key_group(t.key, "string", 128)
    by_group = {}
    for t in result.timers:  # within one timestamp and key group: the stored key order, each key's ns sorted
        by_group.setdefault((t.timestamp, t.key_group, t.key), []).append(t.namespace)
    assert all(namespaces == ["a", "x"] for namespaces in by_group.values())


def test_delete(job):
    register(job, (10, "a"), (10, "b"), (10, "a", "w"))
    with job.transaction() as tx:
        tx.timers.delete("event", "a", 10)
        tx.timers.delete("event", "nobody", 10)  # absent: a no-op, as in Flink
        tx.timers.delete("processing", "b", 10)  # another domain
    assert sorted(fire(job, 10)) == [(10, "a", "w"), (10, "b", "")]


def test_domains_are_separate_and_processing_time_fires(job):
    register(job, (10, "e"))
    register(job, (10, "p"), (50, "q"), domain="processing")
    assert fire(job, 100) == [(10, "e", "")]
    assert fire(job, 20, "processing") == [(10, "p", "")]
    assert fire(job, 60, "processing") == [(50, "q", "")]
    with job.transaction() as tx:
        assert tx.timers.current_time("event") == 100
        assert tx.timers.current_time("processing") == 60


def test_time_never_goes_back_and_late_timers_fire_on_next_advance(job):
    with job.transaction() as tx:
        assert tx.timers.current_time("event") is None
    assert attempts.advance(job, "event", 100).time == 100
    result = attempts.advance(job, "event", 50)  # older: the watermark stays
    assert result.time == 100 and result.timers == []
    register(job, (70, "late"), (100, "at"), (101, "later"))
    assert fire(job, 90) == [(70, "late", ""), (100, "at", "")]  # at or below the watermark: the next advance
    assert fire(job, 100) == []
    assert fire(job, 101) == [(101, "later", "")]


def test_floors_never_hide_a_timer(job):
    """Firing seeks past what it drained (tombstones on RocksDB); a late timer in a drained key
    group, or one staged by an attempt meanwhile, still fires."""
    same = [k for k in (f"k{i}" for i in range(2000)) if assign_to_key_group(k, "string", 128) == 7][:3]
    register(job, (5, same[0]))
    assert fire(job, 100) == [(5, same[0], "")]  # key group 7 drained up to 100
    register(job, (50, same[1]))  # late, below the floor: it lowers it
    assert fire(job, 100) == [(50, same[1], "")]
    job.fence(1)
    attempts.perform(
        job,
        BatchOps([{"op": "register_timer", "key": same[2], "timestamp": 60}]),
        epoch=1,
        attempt=AttemptRef(0, "a", 0),
    )
    assert fire(job, 200) == []  # plain: the staged timer is not the job's yet, and the floor stays down
    staged = attempts.advance(job, "event", 200, epoch=1, attempt=AttemptRef(0, "a", 1))
    assert [(t.key, t.timestamp) for t in staged.timers] == [(same[2], 60)]
    attempts.commit(job, 1, [Winner(0, "a", 2)])
    assert count_timers(job, "event") == {}
    register(job, (10, same[0]))
    assert fire(job, 300) == [(10, same[0], "")]


def test_typed_keys(job):
    register(job, (1, 7), (1, -(2**31)), key_type="int")
    register(job, (1, 7), (2, 2**62), key_type="long")
    register(job, (1, "7"))
    result = attempts.advance(job, "event", 5)
    got = {(t.key, t.key_type) for t in result.timers}
    assert got == {(7, "int"), (-(2**31), "int"), (7, "long"), (2**62, "long"), ("7", "string")}
    for t in result.timers:
        assert t.key_group == assign_to_key_group(t.key, t.key_type, 128)
    with job.transaction() as tx, pytest.raises(Exception, match="int"):
        tx.timers.register("event", "x", 1, key_type="int")
    with job.transaction() as tx, pytest.raises(InvalidArgument, match="timestamp"):
        tx.timers.register("event", "x", 2**63)
    with job.transaction() as tx, pytest.raises(InvalidArgument, match="domain"):
        tx.timers.register("wall", "x", 1)  # type: ignore[arg-type]


def test_limit_and_key_groups(job):
    keys = [f"k{i}" for i in range(50)]
    register(job, *[(i, k) for i, k in enumerate(keys)])
    first = attempts.advance(job, "event", 100, limit=20)
    assert len(first.timers) == 20 and first.more and [t.timestamp for t in first.timers] == list(range(20))
    groups = KeyGroupRange(0, 63)
    mine = attempts.advance(job, "event", 100, key_groups=groups)
    assert mine.timers and all(t.key_group <= 63 for t in mine.timers) and not mine.more
    rest = attempts.advance(job, "event", 100)
    assert all(t.key_group > 63 for t in rest.timers)
    assert len(first.timers) + len(mine.timers) + len(rest.timers) == 50


def test_limited_advances_fire_in_the_same_order_as_one(make_catalog):
    timers = [((i * 7_919) % 101, f"k{i}") for i in range(400)]
    whole, _ = make_catalog().create("whole", 128)
    paged, _ = make_catalog().create("paged", 128)
    for job in (whole, paged):
        register(job, *timers)
    expected = fire(whole, 1_000)
    got: list = []
    while True:
        result = attempts.advance(paged, "event", 1_000, limit=7)
        got += [(t.timestamp, t.key, t.namespace) for t in result.timers]
        if not result.more:
            break
        assert len(result.timers) == 7
    assert got == expected and len(got) == 400


def test_list_and_count_per_key_group(job):
    keys = [f"k{i}" for i in range(100)]
    register(job, *[(i % 3, k) for i, k in enumerate(keys)])
    register(job, (5, "p"), domain="processing")
    counts = count_timers(job, "event")
    expected: dict[int, int] = {}
    for k in keys:
        kg = assign_to_key_group(k, "string", 128)
        expected[kg] = expected.get(kg, 0) + 1
    assert counts == expected
    listed = [t for t, _pos in list_timers(job, "event")]
    assert len(listed) == 100 and [t.key_group for t in listed] == sorted(t.key_group for t in listed)
    kg = next(iter(expected))
    one = [t for t, _pos in list_timers(job, "event", kg)]
    assert len(one) == expected[kg] and all(t.key_group == kg for t in one)
    # paging resumes after a position
    first = list(list_timers(job, "event"))[:40]
    after = list(list_timers(job, "event", start_after=first[-1][1]))
    assert [t for t, _p in first] + [t for t, _p in after] == listed
    assert count_timers(job, "processing") == {assign_to_key_group("p", "string", 128): 1}


def test_timers_are_not_states(make_catalog):
    from statehouse.backends.limits import Limits

    catalog = make_catalog()
    job, _ = catalog.create("capped", 128)
    job.limits = Limits(max_states_per_job=1)
    register(job, (1, "a"))
    register(job, (1, "a"), domain="processing")
    from statehouse.snapshots.stored.descriptors import StateDescriptor

    job.register_state(StateDescriptor("only", "value"))  # the timer tables do not count
    assert set(job.descriptors) == {"only"}
    assert set(keyed_tables(job.partition.tables())) >= TIMER_TABLES


def test_keys_of_other_replicas_refused(make_catalog):
    job, _ = make_catalog(0, 2).create("half", 128)
    foreign = next(f"k{i}" for i in range(100) if assign_to_key_group(f"k{i}", "string", 128) >= 64)
    with job.transaction() as tx, pytest.raises(KeyNotOwned):
        tx.timers.register("event", foreign, 1)


@pytest.mark.parametrize("backend", ["rocksdb"], indirect=True)  # the heap backend keeps nothing across a restart
def test_timers_survive_a_restart(make_catalog, tmp_path):
    catalog = make_catalog(data_dir=tmp_path / "d")
    job, _ = catalog.create("durable", 128)
    register(job, (10, "a"), (20, "b"))
    attempts.advance(job, "event", 10)
    catalog.close()
    job = make_catalog(data_dir=tmp_path / "d").get("durable")
    with job.transaction() as tx:
        assert tx.timers.current_time("event") == 10
    assert fire(job, 20) == [(20, "b", "")]


# -- fencing and task attempts -------------------------------------------------------------------


def test_stale_epoch_refused(job):
    register(job, (1, "a"))
    job.fence(3)
    with pytest.raises(StaleEpoch):
        attempts.advance(job, "event", 10, epoch=2)
    assert fire(job, 10, epoch=3) == [(1, "a", "")]


def test_attempt_firing_is_staged_and_only_the_winner_sticks(job):
    register(job, (1, "a"), (2, "b"), (50, "c"))
    job.fence(1)
    ref = AttemptRef(0, "a0", 0)
    first = attempts.advance(job, "event", 10, epoch=1, attempt=ref)
    assert [t.key for t in first.timers] == ["a", "b"]
    again = attempts.advance(job, "event", 10, epoch=1, attempt=ref)  # re-sent: answered again
    assert again is first
    # not committed: the job still has the timers, and a retried attempt fires the same ones
    assert sum(count_timers(job, "event").values()) == 3
    retry = attempts.advance(job, "event", 10, epoch=1, attempt=AttemptRef(0, "a1", 0))
    assert [t.key for t in retry.timers] == ["a", "b"]
    # within the attempt, what it fired is gone, and what it registers fires on its next advance
    with pytest.raises(AttemptConflict):
        attempts.advance(job, "event", 10, epoch=1, attempt=AttemptRef(0, "a1", 5))
    attempts.perform(
        job,
        BatchOps([{"op": "register_timer", "domain": "event", "key": "d", "timestamp": 5}]),
        epoch=1,
        attempt=AttemptRef(0, "a1", 1),
    )
    later = attempts.advance(job, "event", 10, epoch=1, attempt=AttemptRef(0, "a1", 2))
    assert [t.key for t in later.timers] == ["d"]
    report = attempts.commit(job, 1, [Winner(0, "a1", 3)])
    assert report.ops == 3
    with job.transaction() as tx:
        assert tx.timers.current_time("event") == 10
    assert [t.key for t, _p in list_timers(job, "event")] == ["c"]  # a, b and d fired once, by a1


def test_commit_replays_exactly_what_was_fired(job):
    """A winner's advance is replayed as the timers it fired, not as a new advance: a timer
    another winner registered meanwhile is not lost."""
    register(job, (1, "a"))
    job.fence(1)
    attempts.advance(job, "event", 10, epoch=1, attempt=AttemptRef(0, "p0", 0))
    attempts.perform(
        job, BatchOps([{"op": "register_timer", "key": "b", "timestamp": 3}]), epoch=1, attempt=AttemptRef(1, "p1", 0)
    )
    attempts.commit(job, 1, [Winner(0, "p0", 1), Winner(1, "p1", 1)])
    assert [(t.key, t.timestamp) for t, _p in list_timers(job, "event")] == [("b", 3)]
    assert fire(job, 10) == [(3, "b", "")]


def test_commit_keeps_the_latest_time_of_the_winners(job):
    """Two winners advanced the watermark to different times: the commit keeps the later one (a
    replay raises it twice; taking the last view's clock row would lower it)."""
    job.fence(1)
    low, high = KeyGroupRange(0, 63), KeyGroupRange(64, 127)
    attempts.advance(job, "event", 50, epoch=1, attempt=AttemptRef(0, "p0", 0), key_groups=low)
    attempts.advance(job, "event", 30, epoch=1, attempt=AttemptRef(1, "p1", 0), key_groups=high)
    attempts.commit(job, 1, [Winner(0, "p0", 1), Winner(1, "p1", 1)])
    with job.transaction() as tx:
        assert tx.timers.current_time("event") == 50


def test_two_winners_firing_one_timer_are_refused(job):
    register(job, (1, "a"))
    job.fence(1)
    attempts.advance(job, "event", 10, epoch=1, attempt=AttemptRef(0, "p0", 0))
    attempts.advance(job, "event", 10, epoch=1, attempt=AttemptRef(1, "p1", 0))
    with pytest.raises(AttemptConflict, match="key_groups"):
        attempts.commit(job, 1, [Winner(0, "p0", 1), Winner(1, "p1", 1)])
    assert sum(count_timers(job, "event").values()) == 1  # nothing committed
    job.fence(2)
    half = KeyGroupRange(0, 63)
    other = KeyGroupRange(64, 127)
    got = attempts.advance(job, "event", 10, epoch=2, attempt=AttemptRef(0, "q0", 0), key_groups=half)
    got2 = attempts.advance(job, "event", 10, epoch=2, attempt=AttemptRef(1, "q1", 0), key_groups=other)
    assert len(got.timers) + len(got2.timers) == 1
    attempts.commit(job, 2, [Winner(0, "q0", 1), Winner(1, "q1", 1)])
    assert count_timers(job, "event") == {}


# -- snapshots, restore, rescale -------------------------------------------------------------------


def _timers_everywhere(catalogs, n=300):
    """Register event and processing timers over the replicas that own their keys; the timers
    still due after an advance to 0 (those fired before the snapshot must not come back)."""
    expected = set()
    for catalog in catalogs:
        job, _ = catalog.create("t", 128)
        mine = owned(job, [f"k{i}" for i in range(n)])
        mine_long = owned(job, [i * 7_919_000_001 for i in range(n)], "long")
        register(job, *[(int(k[1:]) % 17, k, "ns") for k in mine])
        register(job, *[(k // 7_919_000_001 % 11, k) for k in mine_long], key_type="long")
        register(job, *[(1_000 + int(k[1:]) % 5, k) for k in mine], domain="processing")
        attempts.advance(job, "event", 0)
        expected |= {(k, int(k[1:]) % 17, "event") for k in mine if int(k[1:]) % 17}
        expected |= {(k, k // 7_919_000_001 % 11, "event") for k in mine_long if k // 7_919_000_001 % 11}
        expected |= {(k, 1_000 + int(k[1:]) % 5, "processing") for k in mine}
    return expected


def _checkpoint(make_manager, catalogs, storage, checkpoint_id, kind="checkpoint"):
    managers = [make_manager(c, storage) for c in catalogs]
    global_checkpoint(managers, "t", checkpoint_id, kind)
    for m in managers:
        m.close()


@pytest.mark.parametrize(
    ("old", "new", "kind"), [(1, 1, "checkpoint"), (2, 3, "checkpoint"), (3, 2, "checkpoint"), (2, 3, "savepoint")]
)
def test_restore_and_rescale_fire_every_timer_once(make_catalog, make_manager, tmp_path, old, new, kind):
    storage = open_storage(f"memory://{uuid.uuid4().hex}")
    before = [make_catalog(i, old, tmp_path / f"old-{i}") for i in range(old)]
    expected = _timers_everywhere(before)
    _checkpoint(make_manager, before, storage, 1, kind)
    for catalog in before:  # what fires after the checkpoint is not in it
        attempts.advance(catalog.get("t"), "event", 10**6)

    after = [make_catalog(i, new, tmp_path / f"new-{i}") for i in range(new)]
    fired = []
    for catalog in after:
        make_manager(catalog, storage).restore("t", 1)
        job = catalog.get("t")
        with job.transaction() as tx:  # the time is not state (Flink: the watermark comes back with the stream)
            assert tx.timers.current_time("event") is None
        for domain in ("event", "processing"):
            for timer in attempts.advance(job, domain, 10**6).timers:
                assert operator_index(128, new, timer.key_group) == catalog.replica_index
                assert timer.key_group == assign_to_key_group(timer.key, timer.key_type, 128)
                fired.append((timer.key, timer.timestamp, domain))
    assert len(fired) == len(set(fired))  # once
    assert set(fired) == expected  # every one


# -- over HTTP: one real server -------------------------------------------------------------


@pytest.fixture
def http_job(http, job_name):
    assert http.put(f"/jobs/{job_name}", json={"max_parallelism": 128}).status_code == 201
    return f"/jobs/{job_name}"


def test_http_register_delete_list_count_advance(http, http_job):
    for ts, key in [(30, "b"), (10, "a"), (10, "a"), (20, "c")]:
        assert http.put(f"{http_job}/timers/event/keys/{key}/{ts}").status_code == 204
    assert http.put(f"{http_job}/timers/event/keys/7/15", params={"key_type": "long", "ns": "w"}).status_code == 204
    assert http.put(f"{http_job}/timers/processing/keys/p/5").status_code == 204
    assert http.delete(f"{http_job}/timers/event/keys/b/30").status_code == 204
    assert http.delete(f"{http_job}/timers/event/keys/nobody/30").status_code == 204  # absent: a no-op

    counts = http.get(f"{http_job}/timers/event/counts").json()
    assert counts["total"] == 3 and counts["time"] is None and counts["domain"] == "event"
    assert sum(c["count"] for c in counts["key_groups"]) == 3
    first = http.get(f"{http_job}/timers/event", params={"limit": 2}).json()
    rest = http.get(f"{http_job}/timers/event", params={"cursor": first["next_cursor"]}).json()
    assert len(first["items"]) == 2 and len(rest["items"]) == 1 and rest["next_cursor"] is None
    kg = assign_to_key_group("a", "string", 128)
    one = http.get(f"{http_job}/timers/event", params={"key_group": kg}).json()["items"]
    assert [(t["key"], t["timestamp"]) for t in one] == [("a", 10)]

    fired = http.post(f"{http_job}/timers/event/advance", json={"to": 15, "limit": 1}).json()
    assert fired["time"] == 15 and fired["more"] is True
    assert [(t["timestamp"], t["key"]) for t in fired["timers"]] == [(10, "a")]
    fired = http.post(f"{http_job}/timers/event/advance", json={"to": 12}).json()  # older: stays at 15
    assert fired["time"] == 15 and fired["more"] is False
    assert fired["timers"] == [
        {"timestamp": 15, "key": 7, "key_type": "long", "ns": "w", "key_group": assign_to_key_group(7, "long", 128)}
    ]
    assert http.get(f"{http_job}/timers/event/counts").json()["time"] == 15
    assert [t["key"] for t in http.post(f"{http_job}/timers/processing/advance", json={"to": 5}).json()["timers"]] == [
        "p"
    ]


def test_http_errors(http, http_job):
    bad = http.put(f"{http_job}/timers/event/keys/abc/1", params={"key_type": "int"})
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_key"
    assert http.put(f"{http_job}/timers/event/keys/a/01").json()["code"] == "validation_error"
    assert http.put(f"{http_job}/timers/wall/keys/a/1").status_code == 422
    assert http.put(f"{http_job}/timers/event/keys/a/{2**63}").status_code == 422
    for body in ({"to": "1"}, {"to": 1, "key_groups": [5, 2]}, {"to": 1, "key_groups": [0, 128]}, {"to": 1, "x": 1}):
        assert http.post(f"{http_job}/timers/event/advance", json=body).status_code == 422, body
    assert http.get(f"{http_job}/timers/event", params={"key_group": 128}).status_code == 422


def test_http_batch_ops_fencing_and_task_attempts(http, http_job):
    ops = [
        {"op": "register_timer", "key": "a", "timestamp": 1},
        {"op": "register_timer", "domain": "event", "key": 5, "key_type": "int", "timestamp": 2, "ns": "w"},
        {"op": "register_timer", "key": "gone", "timestamp": 3},
        {"op": "delete_timer", "key": "gone", "timestamp": 3},
    ]
    assert http.post(f"{http_job}/batch", json={"ops": ops}).json() == {"results": [{}, {}, {}, {}]}
    bad = http.post(f"{http_job}/batch", json={"ops": [{"op": "register_timer", "key": "a"}]})
    assert bad.status_code == 422 and bad.json()["op_index"] == 0
    fenced = http.post(f"{http_job}/fence", json={"epoch": 4}).json()
    assert (fenced["epoch"], fenced["committed_epoch"]) == (4, 0)
    stale = http.post(f"{http_job}/timers/event/advance", json={"to": 10, "epoch": 3})
    assert stale.status_code == 409 and stale.json()["code"] == "stale_epoch"

    attempt = {"epoch": 4, "partition": 0, "seq": 0}
    first = http.post(f"{http_job}/timers/event/advance", json={"to": 10, "attempt": "t0", **attempt}).json()
    assert [t["key"] for t in first["timers"]] == ["a", 5]
    again = http.post(f"{http_job}/timers/event/advance", json={"to": 10, "attempt": "t0", **attempt}).json()
    assert again == first  # a re-sent request
    retry = http.post(f"{http_job}/timers/event/advance", json={"to": 10, "attempt": "t1", **attempt}).json()
    assert retry["timers"] == first["timers"]  # the retried attempt fires the same timers
    assert http.get(f"{http_job}/timers/event/counts").json()["total"] == 2  # nothing committed yet
    commit = http.post(f"{http_job}/epochs/4/commit", json={"attempts": [{"partition": 0, "attempt": "t1", "ops": 1}]})
    assert commit.status_code == 200 and commit.json()["status"] == "committed"
    counts = http.get(f"{http_job}/timers/event/counts").json()
    assert counts["total"] == 0 and counts["time"] == 10


# -- rescale across real replica servers -------------------------------------------------------


def _replicas(tmp_path, tag, count, backend, checkpoints):
    """``count`` replica servers, started at once."""
    from concurrent.futures import ThreadPoolExecutor

    env = {"STATEHOUSE_BACKEND": backend, "STATEHOUSE_CHECKPOINT_DIR": str(checkpoints)}

    def start(i):
        replica = {"STATEHOUSE_REPLICA_INDEX": str(i), "STATEHOUSE_REPLICA_COUNT": str(count)}
        return start_server(tmp_path / f"{tag}-{i}", {**env, **replica})

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(start, range(count)))


def _clients(servers, job):
    return [httpx.Client(base_url=f"{s.url}/v1/jobs/{job}", timeout=30) for s in servers]


def _checkpoint_all(clients, checkpoint_id):
    for c in clients:
        assert c.post("/checkpoints", json={"checkpoint_id": checkpoint_id}).status_code == 202
    for c in clients:
        deadline = time.monotonic() + 30
        while c.get(f"/checkpoints/{checkpoint_id}").json()["status"] != "uploaded":
            assert time.monotonic() < deadline, "checkpoint stuck"
            time.sleep(0.05)
    for c in clients:
        assert c.post(f"/checkpoints/{checkpoint_id}/complete").json()["status"] == "completed"


def _advance_all(clients, fired, to):
    for index, c in enumerate(clients):
        for domain in ("event", "processing"):
            answer = c.post(f"/timers/{domain}/advance", json={"to": to}).json()
            for t in answer["timers"]:
                assert operator_index(128, len(clients), t["key_group"]) == index
                fired.append((domain, t["key"], t["ns"], t["timestamp"]))


def test_rescale_2_to_3_to_2_over_http_fires_every_timer_once(two_replicas, job_name, tmp_path):
    """RocksDB (incremental checkpoints) on two replicas → heap on three → back on the two."""
    keys = [f"k{i}" for i in range(240)]
    registered = {("event", k, "w", int(k[1:]) % 40) for k in keys} | {("processing", k, "", 500) for k in keys}
    fired: list = []

    two = _clients(two_replicas, job_name)
    for c in two:
        assert c.put(str(c.base_url).rstrip("/"), json={"max_parallelism": 128}).status_code == 201
    ops: list[list[dict]] = [[], []]
    for domain, key, ns, ts in sorted(registered):
        owner = operator_index(128, 2, assign_to_key_group(key, "string", 128))
        ops[owner].append({"op": "register_timer", "domain": domain, "key": key, "ns": ns, "timestamp": ts})
    for c, mine in zip(two, ops, strict=True):
        assert c.post("/batch", json={"ops": mine}).status_code == 200
    _advance_all(two, fired, 9)  # some fire before the checkpoint
    _checkpoint_all(two, 1)
    _advance_all(two, [], 20)  # fired after the checkpoint: the restore brings them back

    # the same checkpoint storage, three heap replicas
    servers = _replicas(tmp_path, "three", 3, "heap", two_replicas[0].settings["STATEHOUSE_CHECKPOINT_DIR"])
    try:
        three = _clients(servers, job_name)
        for c in three:
            assert c.post("/restore", json={"checkpoint_id": 1}).status_code == 200
        _advance_all(three, fired, 19)
        _checkpoint_all(three, 2)
    finally:
        for s in servers:
            s.stop()

    for c in two:  # back to two replicas
        assert c.post("/restore", json={"checkpoint_id": 2}).status_code == 200
    _advance_all(two, fired, 10**6)
    assert len(fired) == len(set(fired)) == len(registered)  # every timer, once
    assert set(fired) == registered


# -- the client: two real replicas ---------------------------------------------------------------


def test_client_handles_route_advance_and_stage(two_replicas, job_name):
    from statehouse.client import StatehouseClient
    from statehouse.client.attempts import TaskAttempt, commit_bodies

    with StatehouseClient([s.url for s in two_replicas]) as sh:
        job = sh.create_job(job_name, 128)
        timers = job.timers("event")
        keys = [f"user-{i}" for i in range(60)]
        with job.batch() as batch:  # routed by key to the owner
            for i, key in enumerate(keys):
                batch.register_timer(key, i % 9, "session")
            batch.register_timer(12, 3, key_type="long")
        timers.register("solo", 4)
        timers.delete("solo", 4)
        counts = timers.counts()
        assert sum(counts.values()) == 61
        assert {kg for kg in counts} == {assign_to_key_group(k, "string", 128) for k in keys} | {
            assign_to_key_group(12, "long", 128)
        }
        listed = list(timers.list(page_size=7))
        assert len(listed) == 61 and [t.key_group for t in listed] == sorted(t.key_group for t in listed)
        assert timers.times() == [None, None]

        # a task attempt fires its partition's key groups, staged until the driver commits it
        epoch = job.fence(job.epoch() + 1)
        half = KeyGroupRange(0, 63)  # replica 0's key groups
        attempt = TaskAttempt(epoch, 0, len(job.replicas))
        fired = timers.advance(4, attempt=attempt, key_groups=half)
        assert fired and all(t.key_group <= 63 and t.timestamp <= 4 for t in fired)
        assert [(t.timestamp, t.key_group) for t in fired] == sorted((t.timestamp, t.key_group) for t in fired)
        assert sum(timers.counts().values()) == 61  # staged, not committed
        message = attempt.message()
        assert message.ops == (1, 0)
        for replica, body in enumerate(commit_bodies([message], len(job.replicas))):
            job.replicas[replica].json("POST", f"/v1/jobs/{job_name}/epochs/{epoch}/commit", body)
        assert sum(timers.counts().values()) == 61 - len(fired)

        # plain: every replica, merged in firing order
        rest = timers.advance(100)
        assert len(rest) == 61 - len(fired)
        assert [(t.timestamp, t.key_group) for t in rest] == sorted((t.timestamp, t.key_group) for t in rest)
        every = {(t.key, t.key_type) for t in fired + rest}
        assert every == {(k, "string") for k in keys} | {(12, "long")}  # each once, typed as registered
        assert timers.times() == [100, 100] and timers.counts() == {}


# -- columnar timers ---------------------------------------------------------------------------------


def test_columnar_timers_are_the_same_timers(job):
    import pyarrow as pa

    from statehouse.backends.timer_columns import TimerColumns

    keys = [f"k{i}" for i in range(50)]
    table = pa.table({"key": keys, "timestamp": pa.array([i % 7 for i in range(50)], pa.int64()), "ns": ["w"] * 50})
    attempts.perform(job, TimerColumns.parse("register", "event", "string", table))
    register(job, (3, "k3", "w"))  # the same timer, registered row-wise: one timer
    longs = pa.table({"key": pa.array([5, -(2**40)], pa.int64()), "timestamp": pa.array([1, 2], pa.int64())})
    attempts.perform(job, TimerColumns.parse("register", "event", "long", longs))
    assert sum(count_timers(job, "event").values()) == 52
    gone = pa.table({"key": keys[:10], "timestamp": pa.array([i % 7 for i in range(10)], pa.int64()), "ns": ["w"] * 10})
    attempts.perform(job, TimerColumns.parse("delete", "event", "string", gone))
    fired = fire(job, 100)
    assert len(fired) == 42
    assert set(fired) == {(i % 7, f"k{i}", "w") for i in range(10, 50)} | {(1, 5, ""), (2, -(2**40), "")}

    with pytest.raises(InvalidArgument, match="row 1: timestamp is null"):
        bad = pa.table({"key": ["a", "b"], "timestamp": pa.array([1, None], pa.int64())})
        attempts.perform(job, TimerColumns.parse("register", "event", "string", bad))
    with pytest.raises(InvalidArgument, match="columns"):
        TimerColumns.parse("register", "event", "string", pa.table({"key": ["a"]}))
    with pytest.raises(Exception, match="key"):
        ints = TimerColumns.parse("register", "event", "int", pa.table({"key": ["a"], "timestamp": [1]}))
        attempts.perform(job, ints)
    assert count_timers(job, "event") == {}  # nothing of the refused requests


def test_columnar_timers_staged_for_an_attempt(job):
    import pyarrow as pa

    from statehouse.backends.timer_columns import TimerColumns

    job.fence(1)
    table = pa.table({"key": ["a", "b", "c"], "timestamp": pa.array([1, 2, 3], pa.int64())})
    op = TimerColumns.parse("register", "processing", "string", table)
    attempts.perform(job, op, epoch=1, attempt=AttemptRef(0, "x", 0))
    assert count_timers(job, "processing") == {}  # staged
    fired = attempts.advance(job, "processing", 2, epoch=1, attempt=AttemptRef(0, "x", 1))
    assert [t.key for t in fired.timers] == ["a", "b"]  # the attempt sees its own timers
    attempts.commit(job, 1, [Winner(0, "x", 4)])  # 3 rows + 1 advance
    assert [(t.key, t.timestamp) for t, _p in list_timers(job, "processing")] == [("c", 3)]


def test_http_columnar_timers(http, http_job):
    import pyarrow as pa

    table = pa.table({"key": ["a", "b"], "timestamp": pa.array([5, 6], pa.int64()), "ns": ["x", None]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    body = sink.getvalue().to_pybytes()
    headers = {"content-type": "application/vnd.apache.arrow.stream"}
    answer = http.post(f"{http_job}/timers/event/columns/register", content=body, headers=headers)
    assert answer.status_code == 200 and answer.json() == {"op": "register", "rows": 2, "staged": False}
    fired = http.post(f"{http_job}/timers/event/advance", json={"to": 10}).json()["timers"]
    assert [(t["key"], t["ns"], t["timestamp"]) for t in fired] == [("a", "x", 5), ("b", "", 6)]
    wrong = http.post(
        f"{http_job}/timers/event/columns/register", content=body, headers=headers, params={"key_type": "long"}
    )
    assert wrong.status_code == 422 and wrong.json()["code"] == "invalid_key"
    assert http.post(f"{http_job}/timers/event/columns/upsert", content=body, headers=headers).status_code == 422


def test_client_columnar_timers(two_replicas, job_name):
    import pandas as pd

    from statehouse.client import StatehouseClient
    from statehouse.client.attempts import TaskAttempt

    with StatehouseClient([s.url for s in two_replicas]) as sh:
        job = sh.create_job(job_name, 128)
        timers = job.timers("processing")
        df = pd.DataFrame({"user": [f"u{i}" for i in range(40)], "due": [1_000 + i for i in range(40)]})
        assert timers.register_many(df["user"], df["due"], "s") == 40
        assert timers.register_many([7, 8], [5, 5], key_type="long") == 2
        assert timers.delete_many(df["user"][:10], df["due"][:10], "s") == 10
        assert sum(timers.counts().values()) == 32
        epoch = job.fence(job.epoch() + 1)
        attempt = TaskAttempt(epoch, 3, len(job.replicas))
        timers.register_many(["late"], [1], attempt=attempt)  # staged: one write on its owner
        assert sum(attempt.message().ops) == 1 and sum(timers.counts().values()) == 32
        fired = timers.advance(2_000)
        assert sorted((t.key, t.timestamp) for t in fired[:2]) == [(7, 5), (8, 5)]  # same time: key-group order
        assert [t.key for t in fired[2:]] == [f"u{i}" for i in range(10, 40)]
