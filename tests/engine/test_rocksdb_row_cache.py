"""The RocksDB backend's row cache (``STATEHOUSE_ROCKSDB_ROW_CACHE_BYTES``,
backends/rocksdb/row_cache.py): reads through it answer what RocksDB holds, whatever changed the
data and however reads and writes interleave; it stays within its budget; a table that finds few
of its rows in it reads past it."""

from __future__ import annotations

import contextlib
import random
import sys
import threading

from statehouse.backends.base.partition import RowChanges, WriteOp
from statehouse.backends.rocksdb import row_cache
from statehouse.backends.rocksdb.partition import RocksDBPartition
from statehouse.backends.rocksdb.row_cache import RowCache
from statehouse.backends.rocksdb.store import RocksDBStore
from statehouse.protocol.keygroups import KeyGroupRange

MAX_PARALLELISM = 16
TABLES = ("a", "b")


def _key(i: int) -> tuple[int, bytes]:
    return i % MAX_PARALLELISM, b"k%05d" % i


def _stored(partition: RocksDBPartition, table: str, keys: list[int]) -> list[bytes | None]:
    """What RocksDB itself holds, past the cache."""
    partition._acquire()
    try:
        layout, family = partition._instance.layout, partition._families[table]
        return [family.get(layout.key(table, *_key(i))) for i in keys]
    finally:
        partition._release()


def _read(partition: RocksDBPartition, table: str, keys: list[int]) -> list[bytes | None]:
    located = [_key(i) for i in keys]
    return partition.get_many(table, [kg for kg, _ in located], [p for _, p in located])


def _prefix(values: list[bytes | None], budget: int) -> list[bytes | None]:
    """A read bounded by ``budget`` bytes: the values up to the first that passes it."""
    taken: list[bytes | None] = []
    for value in values:
        taken.append(value)
        budget -= len(value or b"")
        if value is not None and budget < 0:
            break
    return taken


def test_reads_through_the_cache_answer_what_rocksdb_holds(tmp_path):
    """Every way the data changes, in a random order, with a cache small enough to turn its
    generations over: each read answers the plain Python model's values, as RocksDB does."""
    rng = random.Random(7)
    store = RocksDBStore(str(tmp_path), row_cache_bytes=64 << 10)
    partition = store.open_partition("job", MAX_PARALLELISM)
    for table in TABLES:
        partition.create_table(table, False)
    model: dict[str, dict[int, bytes]] = {t: {} for t in TABLES}
    universe = 600
    guard = contextlib.nullcontext
    for step in range(400):
        table = rng.choice(TABLES)
        action = rng.choice(
            ["rows", "rows", "dict", "ops", "read", "read", "read", "drop_key_groups", "load", "reopen", "flush"]
        )
        keys = rng.sample(range(universe), rng.choice([1, 5, 80, 300]))
        if action == "rows":  # a columnar request's puts, a later row of a key winning
            keys += keys[: len(keys) // 3]
            values = [b"r%d-%d" % (step, j) for j in range(len(keys))]
            located = [_key(i) for i in keys]
            changes = RowChanges([kg for kg, _ in located], [p for _, p in located], values)
            partition.write_changes({table: changes}, [])
            for i, value in zip(keys, values, strict=True):
                model[table][i] = value
        elif action == "dict":  # puts and deletes
            changes_dict = {_key(i): (None if rng.random() < 0.4 else b"d%d" % step) for i in keys}
            partition.write_changes({table: changes_dict}, [])
            for i in keys:
                value = changes_dict[_key(i)]
                if value is None:
                    model[table].pop(i, None)
                else:
                    model[table][i] = value
        elif action == "ops":
            ops = []
            for i in keys:
                kind = rng.choice(["put", "delete", "clear"])
                ops.append(WriteOp(kind, table, *_key(i), value=b"o%d" % step if kind == "put" else None))  # type: ignore[arg-type]
                if kind == "put":
                    model[table][i] = b"o%d" % step
                else:
                    model[table].pop(i, None)
            partition.write(ops)
        elif action == "drop_key_groups":
            first = rng.randrange(MAX_PARALLELISM)
            dropped = KeyGroupRange(first, min(first + 2, MAX_PARALLELISM - 1))
            partition.drop_key_groups([table], [dropped])
            model[table] = {i: v for i, v in model[table].items() if _key(i)[0] not in dropped}
        elif action == "load":  # ingested table files
            entries = sorted((*_key(i), b"L%d" % step) for i in keys)
            partition.load_entries(((kg, table, p, b"", v) for kg, p, v in entries), str(tmp_path), guard)
            for i in keys:
                model[table][i] = b"L%d" % step
        elif action == "reopen":
            partition.close()
            partition.reopen()
        elif action == "flush":
            partition.flush()
        checked = rng.sample(range(universe), 100)
        expected = [model[table].get(i) for i in checked]
        assert _read(partition, table, checked) == expected, (step, action)
        assert [partition.get(table, *_key(i)) for i in checked[:3]] == expected[:3]
        bounded = partition.get_many(table, *zip(*(_key(i) for i in checked), strict=True), budget=40)  # type: ignore[call-arg]
        assert bounded == _prefix(expected, 40), (step, action)
    for table in TABLES:
        everything = list(range(universe))
        assert _read(partition, table, everything) == _stored(partition, table, everything)
    assert store.row_cache is not None and store.row_cache.size <= store.row_cache.max_bytes
    partition.close()


def test_a_dropped_table_made_again_reads_empty(tmp_path):
    store = RocksDBStore(str(tmp_path))
    partition = store.open_partition("job", MAX_PARALLELISM)
    partition.create_table("a", False)
    partition.write([WriteOp("put", "a", *_key(i), value=b"x") for i in range(100)])
    assert _read(partition, "a", list(range(100))) == [b"x"] * 100  # cached
    partition.drop_table("a")
    partition.create_table("a", False)
    assert _read(partition, "a", list(range(100))) == [None] * 100
    partition.close()


def test_a_read_never_caches_what_a_write_replaced_while_it_read(tmp_path):
    """A read that found the old values, with a write landing between its read of RocksDB and its
    fill of the cache (another request's commit, in another thread): the write's values win."""
    store = RocksDBStore(str(tmp_path))
    partition = store.open_partition("job", MAX_PARALLELISM)
    partition.create_table("a", False)
    keys = list(range(100))
    partition.write([WriteOp("put", "a", *_key(i), value=b"old") for i in keys])
    rows = partition._rows
    assert rows is not None

    def read_then_write(raw_keys: list[bytes]) -> list[bytes | None]:
        partition._acquire()
        try:
            found = partition._families["a"].get(raw_keys)
        finally:
            partition._release()
        partition.write([WriteOp("put", "a", *_key(i), value=b"new") for i in keys])
        return found

    raw = [partition._instance.layout.key("a", *_key(i)) for i in keys]
    assert rows.read("a", raw, read_then_write) == [b"old"] * 100  # what it read, before the write
    assert _read(partition, "a", keys) == [b"new"] * 100
    partition.close()


def test_the_cache_holds_at_most_its_budget():
    cache = RowCache(200_000)
    table = cache._new_table()
    for start in range(0, 50_000, 500):
        keys = [b"key-%08d" % i for i in range(start, start + 500)]
        with cache.lock:
            cache._fill(table, keys, [b"v" * 40] * 500)
        assert cache.size <= cache.max_bytes
    assert 0 < len(cache) < 50_000
    big = [b"big-%08d" % i for i in range(5_000)]  # more than a generation: not held
    with cache.lock:
        cache._fill(table, big, [b"v" * 40] * 5_000)
    assert cache._lookup(table, big[:10]).count(row_cache._MISS) == 10


def test_a_read_that_names_a_key_twice_moves_its_old_row_once():
    """Two rows of one key in a request (a list state's two adds, say), its row in the old
    generation: both answered, the row moved to the young generation once, counted once."""
    cache = RowCache(200_000)
    table = cache._new_table()
    with cache.lock:
        cache._fill(table, [b"twice", b"other"], [b"v" * 40, b"w" * 40])
        cache._rotate()  # both rows now in the old generation
    held = cache.size
    assert cache._lookup(table, [b"twice", b"missing", b"twice"]) == [b"v" * 40, row_cache._MISS, b"v" * 40]
    assert b"twice" in table.young and b"twice" not in table.old and b"other" in table.old
    assert cache.size == held  # moved, not held twice
    assert cache._lookup(table, [b"twice", b"twice"]) == [b"v" * 40] * 2


def test_a_table_that_finds_few_of_its_rows_reads_past_the_cache(tmp_path, monkeypatch):
    """Reads spread over far more rows than the cache holds: after its warm-up window the table
    reads past the cache; writes meanwhile are read back once it uses the cache again. A table
    whose reads come back stays with it."""
    monkeypatch.setattr(row_cache, "WINDOW_ROWS", 1_000)
    monkeypatch.setattr(row_cache, "BYPASS_ROWS", 3_000)
    store = RocksDBStore(str(tmp_path), row_cache_bytes=40_000)  # ~100 rows a generation
    partition = store.open_partition("job", MAX_PARALLELISM)
    for table in ("spread", "hot"):
        partition.create_table(table, False)
    rows = partition._rows
    assert rows is not None
    rng = random.Random(3)
    for _ in range(30):
        _read(partition, "spread", rng.sample(range(20_000), 100))
        _read(partition, "hot", list(range(50)))
    assert rows._tables["spread"].bypass_left > 0
    assert rows._tables["hot"].bypass_left <= 0
    partition.write([WriteOp("put", "spread", *_key(i), value=b"during") for i in range(100)])
    while rows._tables["spread"].bypass_left > 0:
        _read(partition, "spread", rng.sample(range(20_000), 100))
    assert _read(partition, "spread", list(range(100))) == [b"during"] * 100
    partition.write([WriteOp("put", "spread", *_key(i), value=b"after") for i in range(100)])
    assert _read(partition, "spread", list(range(100))) == [b"after"] * 100
    partition.close()


def test_zero_turns_the_cache_off(tmp_path):
    store = RocksDBStore(str(tmp_path), row_cache_bytes=0)
    assert store.row_cache is None
    partition = store.open_partition("job", MAX_PARALLELISM)
    partition.create_table("a", False)
    partition.write([WriteOp("put", "a", *_key(1), value=b"x")])
    assert partition.get("a", *_key(1)) == b"x"
    partition.close()


def test_threads_reading_and_writing_at_once_read_their_own_writes(tmp_path, monkeypatch):
    """Writers, each the only one of its keys, read back every write while readers fill the cache
    with the same keys from other threads, the interpreter switching threads as often as it can,
    the cache turning its generations over and its tables stepping aside and back: a stale fill
    landing after a write would be read back."""
    monkeypatch.setattr(row_cache, "WINDOW_ROWS", 500)
    monkeypatch.setattr(row_cache, "BYPASS_ROWS", 1_000)
    store = RocksDBStore(str(tmp_path), row_cache_bytes=30_000)
    partition = store.open_partition("job", MAX_PARALLELISM)
    partition.create_table("a", False)
    writers, keys_each, rounds = 3, 40, 1_000
    failures: list[str] = []
    stop = threading.Event()

    def write(w: int) -> None:
        mine = list(range(w * keys_each, (w + 1) * keys_each))
        for r in range(rounds):
            value = b"w%d-%d" % (w, r)
            partition.write_changes(
                {"a": RowChanges(*zip(*(_key(i) for i in mine), strict=True), [value] * len(mine))}, []
            )  # type: ignore[call-arg]
            got = _read(partition, "a", mine)
            if got != [value] * len(mine):
                failures.append(f"writer {w} round {r}: {sorted(set(got), key=repr)[:3]}")
                return

    def read(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            _read(partition, "a", rng.sample(range(writers * keys_each + 200), 70))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        readers = [threading.Thread(target=read, args=(s,)) for s in range(2)]
        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for t in readers + threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        for t in readers:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert failures == []
    partition.close()


def test_a_restore_swapped_in_is_read_not_the_rows_cached_before(tmp_path):
    """A restore builds the job beside the live one and swaps the databases (the same partition
    object reopened over the new one): the rows cached from the old database are not read."""
    store = RocksDBStore(str(tmp_path))
    live = store.open_partition("job", MAX_PARALLELISM)
    live.create_table("a", False)
    keys = list(range(100))
    live.write([WriteOp("put", "a", *_key(i), value=b"live") for i in keys])
    assert _read(live, "a", keys) == [b"live"] * 100  # cached
    staged = store.open_staging("job", MAX_PARALLELISM)
    staged.create_table("a", False)
    staged.write([WriteOp("put", "a", *_key(i), value=b"restored") for i in keys[:50]])
    promoted = store.promote("job", live, staged)
    assert promoted is live
    assert _read(live, "a", keys) == [b"restored"] * 50 + [None] * 50
    live.close()
