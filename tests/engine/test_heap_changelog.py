"""Heap checkpoints as a changelog: deltas of the keys changed since the last completed checkpoint
over a shared full base. Every completed checkpoint must restore exactly what was frozen, whole
or split over replicas, into either backend; the delta must hold what changed, not the state."""

from __future__ import annotations

import contextlib
import logging
import random

import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.heap import changes as heap_changes
from statehouse.backends.heap import snapshot as heap_snapshot
from statehouse.backends.heap.partition import HeapFrozenView
from statehouse.backends.heap.store import HeapStore
from statehouse.backends.rocksdb.store import RocksDBStore
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.errors import SnapshotCorrupt
from statehouse.snapshots.handles import ChangelogHandle
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.stored.codec import split_timestamped
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.ttl import TtlConfig
from tests.support.job_contents import dump, operator_dump, owned_keys

P = 32
STATES = [
    StateDescriptor("v", "value"),
    StateDescriptor("m", "map"),
    StateDescriptor("l", "list"),
    StateDescriptor("r", "reducing", key_type="long", function="sum"),
    StateDescriptor("t", "value", ttl=TtlConfig(1_000)),  # cleaned up as a snapshot is written
    StateDescriptor("tm", "map", ttl=TtlConfig(1_000)),
]
KEYS = [f"k{i}" for i in range(300)]


def _job(clock, store: HeapStore | None = None):
    catalog = JobCatalog(store or HeapStore(), clock=clock)
    job, _ = catalog.create("orders", P)
    for descriptor in STATES:
        job.register_state(descriptor)
    return catalog, job


def _writes(job, rng: random.Random, n: int) -> None:
    """``n`` random writes of every kind, through single-key calls and a columnar ``update_many``."""
    with job.transaction() as tx:
        for _ in range(n):
            key, roll = rng.choice(KEYS), rng.random()
            if roll < 0.25:
                tx.value("v").update(key, rng.randint(0, 10**6))
            elif roll < 0.32:
                tx.value("v").clear(key)
            elif roll < 0.47:
                tx.map("m").put(key, rng.choice("abcd"), rng.random())
            elif roll < 0.54:
                tx.map("m").remove(key, rng.choice("abcd"))
            elif roll < 0.58:
                tx.map("m").clear(key)
            elif roll < 0.70:
                tx.list("l").add(key, rng.randint(0, 9))
            elif roll < 0.73:
                tx.list("l").clear(key)
            elif roll < 0.82:
                tx.reducing("r").add(rng.randint(0, 400), rng.randint(1, 5))
            elif roll < 0.86:
                tx.value("t").update(key, rng.randint(0, 9))
            elif roll < 0.90:
                tx.map("tm").put(key, rng.choice("ab"), rng.randint(0, 9))
            else:
                state = tx.value("v")
                chosen = rng.sample(KEYS, 20)
                state.update_many(state.locate_many(chosen, [""] * len(chosen)), [rng.random() for _ in chosen])


def _unexpired(entries: dict, now_ms: int) -> dict:
    """What a snapshot at ``now_ms`` holds of ``entries``: TTL states' expired entries left out."""
    return {k: v for k, v in entries.items() if k[0] not in ("t", "tm") or split_timestamped(v)[0] + 1_000 > now_ms}


def _checkpoint(manager, checkpoint_id: int) -> None:
    manager.trigger("orders", checkpoint_id)
    assert manager.complete("orders", checkpoint_id).status == "completed"


def _keyed(manager, checkpoint_id: int) -> ChangelogHandle:
    part = manager._state("orders").completed.get(checkpoint_id)
    assert part is not None and part.format == "changelog"
    assert isinstance(part.keyed, ChangelogHandle)
    return part.keyed


def _background_done(manager) -> None:
    """Wait until the manager's background base, if one is being written, is done with."""
    manager._materializer.submit(lambda: None).result(60)


@pytest.mark.parametrize("materialize", [False, True], ids=["inline bases", "background bases"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_completed_checkpoint_restores_what_was_frozen(
    make_manager, tmp_path, clock, monkeypatch, seed, materialize
):
    """Random writes of every state kind, checkpoints between them (some aborted, some taken while
    another is uploading), then each completed checkpoint restored: whole into the heap and into
    RocksDB, and split over two heap replicas. Deltas and new bases both occur; with background
    bases (of any size here), checkpoints also chain on bases forked children wrote between them."""
    monkeypatch.setattr(heap_snapshot, "MATERIALIZE_MIN_BYTES", 0)  # any base, however small
    rng = random.Random(seed)
    storage = open_storage(str(tmp_path / "cp"))
    catalog, job = _job(clock, HeapStore(background_bases=materialize))
    manager = make_manager(catalog, storage, num_retained=100)
    frozen: dict[int, tuple[dict, dict, int]] = {}
    checkpoint_id = 0
    for _step in range(50):
        _writes(job, rng, rng.choice([1, 3, 10, 40]))
        clock.advance(rng.choice([0, 0, 300]))  # TTL entries expire: a later delta must drop them
        if rng.random() < 0.5:
            continue
        checkpoint_id += 1
        expected = (_unexpired(dump(job), clock.now_ms()), operator_dump(job), clock.now_ms())
        manager.trigger("orders", checkpoint_id)
        assert manager.wait("orders", checkpoint_id, 30).status == "uploaded"
        if rng.random() < 0.2:
            manager.abort("orders", checkpoint_id)  # its keys must be in the next delta
            continue
        assert manager.complete("orders", checkpoint_id).status == "completed"
        frozen[checkpoint_id] = expected
        if rng.random() < 0.7:
            _background_done(manager)  # else writes and checkpoints go on while it is written
    handles = {i: _keyed(manager, i) for i in frozen}
    chains = [chain for h in handles.values() for chain in h.chains]
    assert any(chain.deltas for chain in chains), "no checkpoint wrote a delta"
    assert len({chain.base.stream for chain in chains}) > 1, "no checkpoint wrote a new base"
    assert materialize or any(len(h.chains) > 1 for h in handles.values()), "no checkpoint rewrote a slice"
    on_seeds = sum("-heap-seed" in chain.base.stream.path for chain in chains)
    assert bool(on_seeds) == materialize, on_seeds

    # An entry that expired after the checkpoint that last wrote it may stay (cleanup is
    # best-effort, as of each write): every entry alive at the checkpoint must be there as it was.
    for i, (expected, expected_operator, then) in frozen.items():
        fresh = JobCatalog(HeapStore(), clock=clock)
        make_manager(fresh, storage).restore("orders", i)
        assert _unexpired(dump(fresh.get("orders")), then) == expected, f"checkpoint {i}"
        assert operator_dump(fresh.get("orders")) == expected_operator
        fresh.close()
    last = max(frozen)
    rocks = JobCatalog(RocksDBStore(str(tmp_path / "rocks")), clock=clock)
    make_manager(rocks, storage).restore("orders", last)
    assert _unexpired(dump(rocks.get("orders")), frozen[last][2]) == frozen[last][0]
    rocks.close()
    split: dict = {}
    for index in range(2):
        half = JobCatalog(HeapStore(), replica_index=index, replica_count=2, clock=clock)
        make_manager(half, storage).restore("orders", last)
        split.update(dump(half.get("orders")))
        half.close()
    assert _unexpired(split, frozen[last][2]) == frozen[last][0]
    catalog.close()


@pytest.mark.parametrize("bound", [None, 100, 0], ids=["values kept", "some kept", "none kept"])
def test_a_delta_takes_the_values_its_log_kept(make_manager, tmp_path, clock, monkeypatch, bound):
    """A delta takes a flat table's changed values from the change log while the values it keeps
    stay within their byte bound, and past it from the frozen view: the view is read for no flat
    key when every write's values were kept (the single-key writes and the columnar ones alike),
    and either way every completed checkpoint restores what was frozen."""
    if bound is not None:
        monkeypatch.setattr(heap_changes, "MAX_NOTED_VALUE_BYTES", bound)
    read = []
    values = HeapFrozenView.values
    monkeypatch.setattr(HeapFrozenView, "values", lambda view, *args: read.append(args) or values(view, *args))
    rng = random.Random(7)
    storage = open_storage(str(tmp_path / "cp"))
    catalog, job = _job(clock)
    manager = make_manager(catalog, storage, num_retained=100)
    frozen = {}
    for checkpoint_id in range(1, 9):
        _writes(job, rng, 40)
        frozen[checkpoint_id] = (_unexpired(dump(job), clock.now_ms()), clock.now_ms())
        _checkpoint(manager, checkpoint_id)
    assert sum(len(chain.deltas) for chain in _keyed(manager, 8).chains) > 0, "no checkpoint wrote a delta"
    assert (not read) if bound is None else read
    for checkpoint_id, (expected, then) in frozen.items():
        fresh = JobCatalog(HeapStore(), clock=clock)
        make_manager(fresh, storage).restore("orders", checkpoint_id)
        assert _unexpired(dump(fresh.get("orders")), then) == expected, f"checkpoint {checkpoint_id}"
        fresh.close()
    catalog.close()


def test_a_delta_holds_what_changed_and_reuses_the_rest(make_manager, tmp_path, clock):
    """A few keys changed in a large state: the checkpoint uploads a delta of about their size and
    reuses the base; a restore of it is the state."""
    storage = open_storage(str(tmp_path / "cp"))
    catalog, job = _job(clock)
    with job.transaction() as tx:
        for i in range(5_000):
            tx.value("v").update(f"key-{i}", "x" * 100)
    manager = make_manager(catalog, storage, compression="none")
    manager.trigger("orders", 1)
    first = manager.complete("orders", 1)
    with job.transaction() as tx:
        for i in range(10):
            tx.value("v").update(f"key-{i}", "changed")
        tx.value("v").clear("key-20")
    expected = dump(job)
    _checkpoint(manager, 2)
    base, second = _keyed(manager, 1), _keyed(manager, 2)
    assert not base.deltas and second.base == base.base and len(second.deltas) == 1
    metadata = manager._state("orders").completed.get(2)
    assert metadata.bytes_reused == base.base.stream.size
    assert second.deltas[0].stream.size < base.base.stream.size / 50
    assert first.checkpoint_id == 1
    fresh = JobCatalog(HeapStore(), clock=clock)
    make_manager(fresh, storage).restore("orders", 2)
    assert dump(fresh.get("orders")) == expected
    fresh.close()
    catalog.close()


def _weighs(handle: ChangelogHandle) -> tuple[int, int]:
    """The bytes of a changelog's key-group sections: in its chains' bases, in their deltas."""
    lengths = [[sum(s.length for s in h.offsets.sections) for h in chain.streams()] for chain in handle.chains]
    return sum(first for first, *_rest in lengths), sum(sum(rest) for _first, *rest in lengths)


@pytest.mark.parametrize("weight", [1.0, 2.0])
def test_deltas_stay_within_their_weight_a_slice_rewritten_at_a_time(
    make_manager, tmp_path, clock, monkeypatch, weight
):
    """A base when 60% of the keys changed. Then deltas of 30% each: none rewritten until they would
    weigh more than ``weight`` times their base (STATEHOUSE_HEAP_CHANGELOG_DELTA_WEIGHT), then a
    slice of key groups rewritten whole beside a delta, never the whole state at once; and a
    chain of MAX_DELTAS deltas rewritten."""
    storage = open_storage(str(tmp_path / "cp"))
    catalog, job = _job(clock, HeapStore(delta_weight=weight))
    manager = make_manager(catalog, storage, compression="none")
    handles: list[ChangelogHandle] = []

    def checkpoint(keys: range, value: str) -> None:
        with job.transaction() as tx:
            for i in keys:
                tx.value("v").update(f"key-{i}", value)
        checkpoint_id = len(handles) + 1
        _checkpoint(manager, checkpoint_id)
        handles.append(_keyed(manager, checkpoint_id))

    checkpoint(range(1_000), "a")
    checkpoint(range(600), "b")  # 60% of the keys: a base again
    assert len(handles[1].chains) == 1 and not handles[1].chains[0].deltas
    assert handles[1].chains[0].base != handles[0].chains[0].base
    for n in range(int(12 * weight)):
        checkpoint(range(300), f"c{n:02}")  # 30% each
    rewritten = []  # per checkpoint: the key groups it wrote whole
    for handle in handles[2:]:
        own = next(chain.deltas[-1].stream for chain in handle.chains if chain.deltas)
        rewritten.append(sum(len(c.key_group_range) for c in handle.chains if c.base.stream == own))
    first = next(i for i, n in enumerate(rewritten) if n)
    assert first == int(weight / 0.3), rewritten  # the deltas that fit within `weight` bases: none rewritten
    for handle in handles[2:]:
        bases, deltas = _weighs(handle)
        assert deltas <= weight * bases * 1.05, (bases, deltas)
        assert any(chain.deltas for chain in handle.chains), "the whole state rewritten at once"
    assert len({chain.base.stream for handle in handles for chain in handle.chains}) > 4

    monkeypatch.setattr(heap_snapshot, "MAX_DELTAS", 2)
    checkpoint(range(1_000), "d")
    for value in "efg":
        checkpoint(range(10), value)
    assert [[len(c.deltas) for c in h.chains] for h in handles[-4:]] == [[0], [1], [2], [0]]
    catalog.close()


def test_a_restore_reads_each_file_of_its_chains_once(make_manager, tmp_path, clock):
    """Slices rewritten in turn leave chains that name the same delta files, each for its own key
    groups: a restore (whole, or a replica's half) reads each file in one or two ranged requests
    for all of them, fetching at most twice the bytes of what it needs, and restores the state."""
    storage = open_storage(str(tmp_path / "cp"))
    catalog, job = _job(clock, HeapStore(delta_weight=1.0))
    manager = make_manager(catalog, storage, compression="none")
    for n in range(12):
        with job.transaction() as tx:
            for i in range(1_000 if n == 0 else 300):
                tx.value("v").update(f"key-{(i * 7 + n) % 1_000}", f"v{n}")
        _checkpoint(manager, n + 1)
    handle = _keyed(manager, 12)
    assert len(handle.chains) > 2 and len({c.base.stream for c in handle.chains}) > 2
    expected = dump(job)
    read: list[tuple[str, int]] = []
    plain = storage.read

    def counted(path: str, offset: int = 0, length: int | None = None) -> bytes:
        data = plain(path, offset, length)
        read.append((path.rsplit("/", 1)[-1], len(data)))
        return data

    storage.read = counted  # type: ignore[method-assign]
    restored: dict = {}
    for index, count in [(0, 1), (0, 2), (1, 2)]:
        read.clear()
        fresh = JobCatalog(HeapStore(), replica_index=index, replica_count=count, clock=clock)
        make_manager(fresh, storage).restore("orders", 12)
        if count == 2:
            restored.update(dump(fresh.get("orders")))
        else:
            assert dump(fresh.get("orders")) == expected
        fresh.close()
        wanted = KeyGroupRange.for_operator(P, count, index)
        used = [h for c in handle.chains if (r := c.restricted(wanted)) for h in r.streams()]
        streams = {h.stream.path.rsplit("/", 1)[-1] for h in used}
        needed = sum(h.header.length + sum(s.length for s in h.offsets.sections) for h in used)
        by_file = [path for path, _n in read if path in streams]
        assert all(by_file.count(path) <= 2 for path in streams), sorted(by_file)
        assert len(by_file) < sum(len(c.streams()) for c in handle.chains), "a file read once per chain"
        assert sum(n for path, n in read if path in streams) <= 2 * needed
    assert restored == expected
    catalog.close()


def test_changes_it_cannot_follow_start_a_new_base(make_manager, tmp_path, clock):
    """A dropped state, or key groups dropped (a move), loses the log: the next checkpoint is a
    base, and it restores the state without the dropped entries."""
    storage = open_storage(str(tmp_path / "cp"))
    catalog, job = _job(clock)
    manager = make_manager(catalog, storage)
    _writes(job, random.Random(7), 200)
    _checkpoint(manager, 1)
    job.drop_state("m")
    _checkpoint(manager, 2)
    assert not _keyed(manager, 2).deltas
    _writes_without_maps(job)
    _checkpoint(manager, 3)
    assert len(_keyed(manager, 3).deltas) == 1
    expected = dump(job)
    fresh = JobCatalog(HeapStore(), clock=clock)
    make_manager(fresh, storage).restore("orders", 3)
    assert dump(fresh.get("orders")) == expected
    fresh.close()
    catalog.close()


def _writes_without_maps(job) -> None:
    with job.transaction() as tx:
        tx.value("v").update("k1", "after the drop")


def test_retention_deletes_the_bases_and_deltas_no_retained_checkpoint_uses(make_manager, tmp_path, clock):
    storage = open_storage(str(tmp_path / "cp"))
    catalog, job = _job(clock)
    manager = make_manager(catalog, storage, num_retained=1)
    rng = random.Random(3)
    used = set()
    for checkpoint_id in range(1, 13):
        _writes(job, rng, 5 if checkpoint_id % 5 else 2_000)
        _checkpoint(manager, checkpoint_id)
        used = {h.stream.path for h in _keyed(manager, checkpoint_id).streams()}
    manager.drain_deletes(30)
    shared = {f"../shared/{p.rsplit('/', 1)[1]}" for p in storage.list("orders/shared")}
    assert shared == used


def test_a_corrupt_delta_is_refused_and_the_state_kept(make_manager, tmp_path, clock):
    storage = open_storage(str(tmp_path / "cp"))
    catalog, job = _job(clock)
    manager = make_manager(catalog, storage)
    _writes(job, random.Random(5), 300)
    _checkpoint(manager, 1)
    _writes(job, random.Random(6), 5)
    _checkpoint(manager, 2)
    delta = next(p for p in storage.list("orders/shared") if p.endswith("-heap-delta"))
    path = tmp_path / "cp" / delta
    data = bytearray(path.read_bytes())
    data[-2] ^= 0xFF
    path.write_bytes(bytes(data))
    live = dump(job)
    with pytest.raises(SnapshotCorrupt, match=r"corrupt|checksum"):
        manager.restore("orders", 2)
    assert dump(catalog.get("orders")) == live
    catalog.close()


def test_the_data_source_reads_a_changelog_as_the_restore_does(make_manager, tmp_path, clock):
    """The Spark data source's checkpoint reader reads a changelog part's records: the base with
    the deltas applied, per key group range, as a restore sees them; of one chain, and of three
    (a key group dropped whole begins its own)."""
    pytest.importorskip("pyspark")
    from statehouse.client.datasource.checkpoint import part_records
    from statehouse.protocol.keygroups import KeyGroupRange
    from statehouse.snapshots.layout import snapshot_dir
    from statehouse.snapshots.metadata import SnapshotPart

    storage = open_storage(str(tmp_path / "cp"))
    catalog, job = _job(clock)
    manager = make_manager(catalog, storage)
    rng = random.Random(11)
    for checkpoint_id in (1, 2, 3):
        _writes(job, rng, 300 if checkpoint_id == 1 else 20)
        _checkpoint(manager, checkpoint_id)
    assert len(_keyed(manager, 3).deltas) == 2
    states = {3: dump(job)}
    job.partition.drop_key_groups(["v", "m", "l"], [KeyGroupRange(7, 7)])
    _writes(job, rng, 20)
    _checkpoint(manager, 4)
    assert len(_keyed(manager, 4).chains) == 3
    states[4] = dump(job)
    for checkpoint_id, expected in states.items():
        metadata = manager._state("orders").completed.get(checkpoint_id)
        part = SnapshotPart(snapshot_dir("orders", checkpoint_id, "checkpoint"), metadata)
        for table in ("v", "m", "l"):
            for wanted in (KeyGroupRange(0, P - 1), KeyGroupRange(5, 9), KeyGroupRange(7, 7)):
                read = {
                    (table, kg, primary, secondary): value
                    for columns in part_records(storage, part, table, wanted)
                    for kg, primary, secondary, value in zip(*(_listed(c) for c in columns), strict=True)
                }
                want = {k: v for k, v in expected.items() if k[0] == table and k[1] in wanted}
                assert read == want, (checkpoint_id, table, wanted)
    catalog.close()


def _listed(column) -> list:
    return column.to_pylist() if hasattr(column, "to_pylist") else list(column)


def test_key_groups_replaced_whole_outside_the_range_leave_deltas_going(make_manager, tmp_path, clock):
    """A live rescale's load brings key groups the replica does not own yet, and an abort drops
    them: no checkpoint of the current range holds them, so deltas go on. A key group of the range
    dropped whole begins a chain of its own (written whole), the others' chains go on."""
    from statehouse.protocol.keygroups import KeyGroupRange

    storage = open_storage(str(tmp_path / "cp"))
    catalog = JobCatalog(HeapStore(), replica_index=0, replica_count=2, clock=clock)
    job, _ = catalog.create("orders", P)
    for descriptor in STATES:
        job.register_state(descriptor)
    assert job.key_group_range == KeyGroupRange(0, 15)
    manager = make_manager(catalog, storage)
    owned = owned_keys(job, KEYS)

    def write(value: str, keys: list[str]) -> None:
        with job.transaction() as tx:
            for key in keys:
                tx.value("v").update(key, value)
                tx.map("m").put(key, value, 1)

    write("a", owned)
    _checkpoint(manager, 1)
    incoming = [(kg, "v", f"in-{kg}".encode(), b"", b"\xa1x") for kg in range(16, 20)]
    job.partition.load_entries(incoming, str(tmp_path), contextlib.nullcontext)
    write("b", owned[::7])
    _checkpoint(manager, 2)
    assert len(_keyed(manager, 2).deltas) == 1
    expected = dump(job)
    job.partition.drop_key_groups(["v"], [KeyGroupRange(16, 19)])  # an abort drops what it loaded
    _checkpoint(manager, 3)
    assert len(_keyed(manager, 3).deltas) == 2
    job.partition.drop_key_groups(["v"], [KeyGroupRange(3, 3)])
    _checkpoint(manager, 4)
    chains = _keyed(manager, 4).chains
    assert [c.key_group_range for c in chains] == [KeyGroupRange(0, 2), KeyGroupRange(3, 3), KeyGroupRange(4, 15)]
    assert [len(c.deltas) for c in chains] == [3, 0, 3]
    assert chains[1].base.stream == chains[0].deltas[-1].stream  # the checkpoint's own stream
    for checkpoint_id, state in ((2, expected), (4, dump(job))):
        fresh = JobCatalog(HeapStore(), replica_index=0, replica_count=2, clock=clock)
        make_manager(fresh, storage).restore("orders", checkpoint_id)
        assert dump(fresh.get("orders")) == state
        fresh.close()
    catalog.close()


def test_the_log_stays_bounded(make_manager, tmp_path, clock):
    """Without checkpoints nothing is noted; with checkpoints that never complete, the log is lost
    past its bound, and the next checkpoint that can complete writes a base."""
    from statehouse.backends.heap.changes import ChangeLog

    storage = open_storage(str(tmp_path / "cp"))
    catalog, job = _job(clock)
    log = job.partition.changes = ChangeLog(max_rows=500)
    _writes(job, random.Random(1), 2_000)
    assert log.lost_reason is None and not log._current.keys  # no cut yet: nothing kept
    manager = make_manager(catalog, storage)
    _checkpoint(manager, 1)
    _writes(job, random.Random(2), 20)
    _checkpoint(manager, 2)
    assert len(_keyed(manager, 2).deltas) == 1
    for _ in range(30):  # checkpoints that never complete: each cut keeps its segment
        _writes(job, random.Random(3), 40)
    assert log.lost_reason is not None and "rows noted" in log.lost_reason
    _checkpoint(manager, 3)
    assert not _keyed(manager, 3).deltas
    catalog.close()


@pytest.mark.parametrize("ends", ["the move aborts", "a checkpoint takes it"])
def test_a_seed_pins_the_log_no_longer_once_it_ends(make_manager, tmp_path, clock, caplog, ends):
    """A heap seed pins the change log at its cut until a checkpoint takes it. A move that aborts
    (``discard_seeds``) lets the pin go, and so does the checkpoint that takes the seed, whether
    it chains on the seed's base or on chains it holds already (a staying replica's, whose older
    cut it builds on): each completed checkpoint then lets go of what was noted before it,
    instead of the log keeping every change since the seed until its bound."""
    from statehouse.backends.heap.changes import ChangeLog
    from statehouse.protocol.keygroups import KeyGroupRange

    storage = open_storage(str(tmp_path / "cp"))
    catalog, job = _job(clock)
    log = job.partition.changes = ChangeLog(max_rows=1_500)
    manager = make_manager(catalog, storage)
    _writes(job, random.Random(1), 200)
    _checkpoint(manager, 1)
    assert manager.seed("orders", [KeyGroupRange(0, 7)], joining=False) > 0
    assert log._pinned is not None
    if ends == "the move aborts":
        manager.discard_seeds()
    else:
        _writes(job, random.Random(2), 100)
        _checkpoint(manager, 2)
    assert log._pinned is None
    rng = random.Random(3)
    caplog.set_level(logging.INFO, logger="statehouse.backends.heap.changes")
    for checkpoint_id in range(3, 13):  # ~2,900 rows noted in all: past the bound, were they all kept
        _writes(job, rng, 100)
        _checkpoint(manager, checkpoint_id)
    assert "heap changelog lost" not in caplog.text
    catalog.close()


def test_a_seed_that_fails_lets_its_pin_go(make_manager, tmp_path, clock):
    """A move's seed whose upload fails (storage down) is no seed: nothing is left for an abort to
    unpin, so the failure itself lets the log go on past its cut."""
    from statehouse.protocol.keygroups import KeyGroupRange
    from statehouse.snapshots.storage.local import LocalStorage

    class SeedsFail(LocalStorage):
        def create_output(self, path):
            if path.endswith("-heap-seed"):
                raise OSError("storage down")
            return super().create_output(path)

    catalog, job = _job(clock)
    manager = make_manager(catalog, SeedsFail(str(tmp_path / "cp")))
    _writes(job, random.Random(1), 200)
    _checkpoint(manager, 1)
    with pytest.raises(OSError, match="storage down"):
        manager.seed("orders", [KeyGroupRange(0, 7)], joining=False)
    assert job.partition.changes._pinned is None
    catalog.close()


def _seed_files(storage) -> list[str]:
    return [p for p in storage.list("") if p.endswith("-heap-seed")]


@pytest.mark.parametrize("meanwhile", ["deltas", "an inline base", "a restore"])
def test_a_background_base_is_chained_on_unless_made_moot(make_manager, tmp_path, clock, monkeypatch, meanwhile):
    """Once a checkpoint's deltas weigh half what makes a base, a forked child writes a new base
    from the fork's memory while writes and checkpoints go on; the first checkpoint after it is
    uploaded chains on it, a delta of what changed since the fork. Unless a checkpoint wrote a
    base inline meanwhile, or a restore replaced the state: then it is dropped, its file deleted.
    Every checkpoint restores what was frozen."""
    from statehouse.snapshots.storage.local import LocalStorage
    from tests.support.gated import gated

    monkeypatch.setattr(heap_snapshot, "MATERIALIZE_MIN_BYTES", 0)
    storage = gated(LocalStorage, str(tmp_path / "cp"), gates=lambda path: path.endswith("-heap-seed"))
    catalog, job = _job(clock, HeapStore(background_bases=True))
    (tmp_path / "work").mkdir()
    manager = make_manager(catalog, storage, num_retained=100, compression="none", work_dir=str(tmp_path / "work"))
    frozen: dict[int, dict] = {}

    def checkpoint(keys: range, value: str) -> ChangelogHandle:
        with job.transaction() as tx:
            for i in keys:
                tx.value("v").update(f"key-{i}", value)
        checkpoint_id = max(frozen, default=0) + 1
        frozen[checkpoint_id] = dump(job)
        _checkpoint(manager, checkpoint_id)
        return _keyed(manager, checkpoint_id)

    first = checkpoint(range(1_000), "a")
    assert not first.deltas
    checkpoint(range(300), "b")
    checkpoint(range(300), "c")  # two deltas of 30%: half of what makes a base, one is forked
    assert manager._materializing == {"orders"}  # its upload waits at the gate
    if meanwhile == "deltas":
        during = checkpoint(range(200, 400), "d")
        assert during.base == first.base and len(during.deltas) == 3
    elif meanwhile == "an inline base":
        during = checkpoint(range(600), "d")  # most keys changed: a base inline
        assert not during.deltas and during.base != first.base
    else:
        manager.restore("orders", 2)
        job = catalog.get("orders")
    storage.gate.set()
    _background_done(manager)
    after = checkpoint(range(50), "e")
    if meanwhile == "deltas":
        assert "-heap-seed" in after.base.stream.path and len(after.deltas) == 1
        assert len(_seed_files(storage)) == 1
    else:
        assert "-heap-seed" not in after.base.stream.path
        assert _seed_files(storage) == []
    assert not list((tmp_path / "work").iterdir()), "the writer's scratch directory stayed"
    for checkpoint_id, expected in frozen.items():
        if meanwhile == "a restore" and checkpoint_id == 3:
            continue  # replaced by the restore: retained, but not what the job went on from
        fresh = JobCatalog(HeapStore(), clock=clock)
        make_manager(fresh, storage).restore("orders", checkpoint_id)
        assert dump(fresh.get("orders")) == expected, f"checkpoint {checkpoint_id}"
        fresh.close()
    catalog.close()


@pytest.mark.parametrize("why", ["the writer fails", "the fork fails", "no room for the fork's copy"])
def test_no_background_base_leaves_the_checkpoints_as_they_were(make_manager, tmp_path, clock, monkeypatch, why):
    """A forked writer that fails, a fork refused, or memory without room for the fork's copy: no
    base is kept, the log is not left pinned, and the checkpoints go on, writing their base inline when due."""
    from statehouse.backends.heap import materialize

    monkeypatch.setattr(heap_snapshot, "MATERIALIZE_MIN_BYTES", 0)
    if why == "the writer fails":

        def failing(*args, **kwargs):
            raise OSError("disk full")

        monkeypatch.setattr(materialize, "write_key_groups", failing)
    elif why == "the fork fails":

        def no_fork():
            raise OSError(12, "Cannot allocate memory")

        monkeypatch.setattr(materialize.os, "fork", no_fork)
    else:
        monkeypatch.setattr(heap_snapshot, "room_for_a_copy", lambda: False)
    storage = open_storage(str(tmp_path / "cp"))
    catalog, job = _job(clock, HeapStore(background_bases=True))
    manager = make_manager(catalog, storage, num_retained=100, work_dir=str(tmp_path / "work"))
    rng = random.Random(5)
    for checkpoint_id in range(1, 12):
        _writes(job, rng, 60)
        expected = _unexpired(dump(job), clock.now_ms())
        _checkpoint(manager, checkpoint_id)
        _background_done(manager)
        assert job.partition.changes._pinned is None
        assert manager._seeds == {}
    assert _seed_files(storage) == []
    fresh = JobCatalog(HeapStore(), clock=clock)
    make_manager(fresh, storage).restore("orders", 11)
    assert _unexpired(dump(fresh.get("orders")), clock.now_ms()) == expected
    fresh.close()
    catalog.close()
