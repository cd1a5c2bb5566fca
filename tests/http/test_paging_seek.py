"""Listings that seek: map entries and stored keys page from their cursor.

Over real HTTP (RocksDB): a map pages end to end, every entry once and in order, with writes
between pages; TTL, namespaces and bad cursors; the whole-map and list size rules. In process, on
both backends (each seeks its own way), through a partition that counts what it hands out: a page
reads about a page, never the whole map (these fail if a listing goes back to reading everything
and filtering).
"""

from __future__ import annotations

import base64
import random
import time
from collections.abc import Iterator

import httpx
import msgpack
import pytest

from statehouse.backends.heap import partition as heap_partition
from statehouse.backends.heap.partition import HeapPartition, _Container
from statehouse.backends.job import Job
from statehouse.backends.limits import Limits
from statehouse.backends.rocksdb.partition import RocksDBPartition
from statehouse.backends.ttl import ManualClock
from statehouse.snapshots.stored.descriptors import StateDescriptor
from tests.support.server import start_server

pytestmark = [pytest.mark.http]

MSGPACK = "application/msgpack"
PAGE = 1000


@pytest.fixture
def job(http, job_name):
    assert http.put(f"/jobs/{job_name}", json={"max_parallelism": 128}).status_code == 201
    return f"/jobs/{job_name}"


def register(http, job, state, **descriptor):
    r = http.put(f"{job}/states/{state}", json=descriptor)
    assert r.status_code == 201, r.text


def fill(http, job, state, key, user_keys, ns="", value=lambda uk: uk):
    """Map entries through the batch endpoint, 5,000 per msgpack request."""
    user_keys = list(user_keys)
    for start in range(0, len(user_keys), 5000):
        ops = [
            {"op": "map_put", "state": state, "key": key, "user_key": uk, "value": value(uk), "ns": ns}
            for uk in user_keys[start : start + 5000]
        ]
        r = http.post(
            f"{job}/batch", content=msgpack.packb({"ops": ops}), headers={"Content-Type": MSGPACK, "Accept": MSGPACK}
        )
        assert r.status_code == 200, r.text


def pages(http, path, limit=PAGE, **params) -> Iterator[list[dict]]:
    """Each page's items, following next_cursor until it is null."""
    cursor = None
    for _ in range(10_000):
        r = http.get(path, params={"limit": limit, **params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        yield r.json()["items"]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return
    raise AssertionError("paging did not end")


def uk(i: int) -> str:
    return f"u{i:06d}"


# -- map entries over HTTP ------------------------------------------------------------------------


def test_a_large_map_pages_end_to_end_once_each_in_order(http, job):
    register(http, job, "m", kind="map")
    expected = [uk(i) for i in range(20_000)]
    shuffled = expected[:]
    random.Random(7).shuffle(shuffled)  # insertion order is not the listing's order
    fill(http, job, "m", "big", shuffled)
    seen = [item for page in pages(http, f"{job}/states/m/keys/big/entries") for item in page]
    assert [item["key"] for item in seen] == expected
    assert all(item["value"] == item["key"] for item in seen)


def test_writes_between_pages(http, job):
    register(http, job, "m", kind="map")
    fill(http, job, "m", "k", [uk(i) for i in range(0, 6000, 2)])  # even numbers: 3,000 entries
    path = f"{job}/states/m/keys/k/entries"
    first = http.get(path, params={"limit": 1000}).json()
    assert [e["key"] for e in first["items"]] == [uk(i) for i in range(0, 2000, 2)]
    # Before the cursor (not listed again), after it (listed), and deletes after it (not listed).
    fill(http, job, "m", "k", [uk(1), uk(999), uk(2001), uk(4001), uk(9999)])
    for deleted in (2000, 2002, 5998):
        assert http.delete(f"{path}/{uk(deleted)}").status_code == 204
    rest = [e["key"] for page in pages(http, path, cursor=first["next_cursor"]) for e in page]
    expected = sorted(
        {uk(i) for i in range(2000, 6000, 2)} - {uk(2000), uk(2002), uk(5998)} | {uk(2001), uk(4001), uk(9999)}
    )
    assert rest == expected


def test_expired_entries_are_skipped(http, job):
    register(http, job, "m", kind="map", ttl={"ttl_ms": 1500})
    fill(http, job, "m", "k", [f"old{i:03d}" for i in range(300)])
    time.sleep(1.6)  # the old entries expire; the new ones are written now and live 1.5 s
    fill(http, job, "m", "k", [f"new{i:03d}" for i in range(300)] + [f"zzz{i:03d}" for i in range(300)])
    seen = [e["key"] for page in pages(http, f"{job}/states/m/keys/k/entries", limit=100) for e in page]
    assert seen == [f"new{i:03d}" for i in range(300)] + [f"zzz{i:03d}" for i in range(300)]


def test_namespaces_page_apart(http, job):
    register(http, job, "m", kind="map")
    fill(http, job, "m", "k", [uk(i) for i in range(1500)], ns="a")
    fill(http, job, "m", "k", [uk(i) for i in range(700, 2500)], ns="b", value=lambda u: "b")
    path = f"{job}/states/m/keys/k/entries"
    a = [e for page in pages(http, path, ns="a") for e in page]
    b = [e for page in pages(http, path, ns="b") for e in page]
    assert [e["key"] for e in a] == [uk(i) for i in range(1500)] and {e["value"] for e in b} == {"b"}
    assert [e["key"] for e in b] == [uk(i) for i in range(700, 2500)]
    assert list(pages(http, path, ns="c")) == [[]]


@pytest.mark.parametrize("path", ["/states/m/keys/k/entries", "/states/m/keys", "/checkpoints"])
def test_a_bad_cursor_is_refused(http, job, path):
    register(http, job, "m", kind="map")
    fill(http, job, "m", "k", ["a", "b"])
    forged = base64.urlsafe_b64encode(b"9" * 4301).decode()  # digits past Python's int() limit
    for cursor in ("!!not base64!!", "", *((forged,) if path == "/checkpoints" else ())):
        r = http.get(f"{job}{path}", params={"cursor": cursor})
        assert r.status_code == 422 and r.json()["code"] == "invalid_argument", r.text


def test_entries_of_a_missing_map_and_the_wrong_kind(http, job):
    register(http, job, "m", kind="map")
    register(http, job, "v", kind="value")
    assert list(pages(http, f"{job}/states/m/keys/nobody/entries")) == [[]]
    r = http.get(f"{job}/states/v/keys/k/entries")
    assert r.status_code == 409 and r.json()["code"] == "wrong_state_kind"


# -- stored keys over HTTP ------------------------------------------------------------------------


def test_keys_listing_pages_every_key_once(http, job):
    register(http, job, "m", kind="map")
    register(http, job, "v", kind="value")
    keys = [f"key{i:05d}" for i in range(3000)]
    ops = [{"op": "put", "state": "v", "key": k, "value": 1} for k in keys]
    assert http.post(f"{job}/batch", json={"ops": ops}).status_code == 200
    ops = [
        {"op": "map_put", "state": "m", "key": k, "user_key": f"e{j}", "value": j} for k in keys[:300] for j in range(5)
    ]
    ops += [{"op": "map_put", "state": "m", "key": k, "user_key": "x", "value": 0, "ns": "other"} for k in keys[:50]]
    assert http.post(f"{job}/batch", json={"ops": ops}).status_code == 200

    listed = [item for page in pages(http, f"{job}/states/v/keys", limit=250) for item in page]
    assert sorted(item["key"] for item in listed) == keys  # each once
    order = [(item["key_group"], item["key"]) for item in listed]
    assert [kg for kg, _k in order] == sorted(kg for kg, _k in order)  # key-group order
    # A map with five entries is one key; another namespace is not listed.
    in_maps = [item["key"] for page in pages(http, f"{job}/states/m/keys", limit=64) for item in page]
    assert sorted(in_maps) == keys[:300]
    other = [item["key"] for page in pages(http, f"{job}/states/m/keys", limit=7, ns="other") for item in page]
    assert sorted(other) == keys[:50]


def test_keys_listing_with_writes_between_pages(http, job):
    register(http, job, "v", kind="value")
    ops = [{"op": "put", "state": "v", "key": f"k{i}", "value": i} for i in range(500)]
    assert http.post(f"{job}/batch", json={"ops": ops}).status_code == 200
    path = f"{job}/states/v/keys"
    first = http.get(path, params={"limit": 200}).json()
    listed = {item["key"] for item in first["items"]}
    assert len(listed) == 200
    removed = next(f"k{i}" for i in range(500) if f"k{i}" not in listed)
    assert http.delete(f"{path}/{removed}").status_code == 204
    rest = [item["key"] for page in pages(http, path, limit=200, cursor=first["next_cursor"]) for item in page]
    assert removed not in rest and not listed & set(rest)
    assert listed | set(rest) == {f"k{i}" for i in range(500)} - {removed}


# -- size rules, on a server with small limits -----------------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    env = {"STATEHOUSE_BACKEND": "rocksdb", "STATEHOUSE_MAX_MAP_READ_ENTRIES": "100"}
    srv = start_server(tmp_path_factory.mktemp("small"), {**env, "STATEHOUSE_MAX_LIST_BYTES": "1000"})
    with httpx.Client(base_url=srv.url + "/v1", timeout=10) as client:
        yield client
    srv.stop()


def test_a_whole_map_read_is_bounded_and_paging_is_not(small, job_name):
    http, job = small, f"/jobs/{job_name}"
    assert http.put(job).status_code == 201
    register(http, job, "m", kind="map")
    fill(http, job, "m", "k", [uk(i) for i in range(100)])
    assert len(http.get(f"{job}/states/m/keys/k").json()["value"]) == 100  # at the limit: read whole
    fill(http, job, "m", "k", [uk(100)])
    r = http.get(f"{job}/states/m/keys/k")
    assert r.status_code == 413 and r.json()["code"] == "map_too_large" and "/entries" in r.json()["detail"]
    batch = http.post(
        f"{job}/batch",
        json={"ops": [{"op": "get", "state": "m", "key": "small"}, {"op": "get", "state": "m", "key": "k"}]},
    )
    assert batch.status_code == 413 and batch.json()["op_index"] == 1
    assert len([e for page in pages(http, f"{job}/states/m/keys/k/entries", limit=30) for e in page]) == 101


def test_a_list_past_its_size_limit_is_refused_whole(small, job_name):
    http, job = small, f"/jobs/{job_name}"
    assert http.put(job).status_code == 201
    register(http, job, "l", kind="list")
    path = f"{job}/states/l/keys/k"
    assert http.post(f"{path}/add", json={"values": ["x" * 90] * 10}).status_code == 204  # 920 bytes stored
    r = http.post(f"{path}/add", json={"value": "x" * 90})
    assert r.status_code == 413 and r.json()["code"] == "list_too_large", r.text
    assert len(http.get(path).json()["value"]) == 10  # nothing was added
    r = http.put(path, json={"value": ["y" * 200] * 6})
    assert r.status_code == 413 and r.json()["code"] == "list_too_large"
    assert http.put(path, json={"value": ["y"]}).status_code == 204


# -- in process: a page reads a page ------------------------------------------------------------------


class Counting:
    """What a partition's reads handed out: entries of whole-map and seeking reads."""

    def __init__(self) -> None:
        self.whole = 0  # entries of items() and scan(): reads of everything
        self.seek = 0  # entries of items_from() and primaries_from()

    def wrap(self, cls: type) -> type:
        counts = self

        class Instrumented(cls):  # type: ignore[misc, valid-type]
            def items(self, *args):
                for entry in super().items(*args):
                    counts.whole += 1
                    yield entry

            def scan(self, *args):
                for entry in super().scan(*args):
                    counts.whole += 1
                    yield entry

            def items_from(self, *args):
                for entry in super().items_from(*args):
                    counts.seek += 1
                    yield entry

            def primaries_from(self, *args):
                for primary in super().primaries_from(*args):
                    counts.seek += 1
                    yield primary

        return Instrumented


@pytest.fixture(params=["heap", "rocksdb"])
def counted(request, tmp_path):
    """A partition of each backend that counts what it hands out: each backend seeks its own way
    (a sorted heap structure, a RocksDB iterator), so each is checked."""
    counts = Counting()
    if request.param == "heap":
        partition = counts.wrap(HeapPartition)(128)
    else:
        partition = counts.wrap(RocksDBPartition)(str(tmp_path / "db"), 128)
    clock = ManualClock(1_000)
    job = Job("j", partition, clock=clock, limits=Limits(max_map_read_entries=1_000_000))
    yield job, counts, clock
    partition.close()


def test_a_map_page_reads_about_a_page(counted):
    job, counts, _clock = counted
    job.register_state(StateDescriptor("m", "map"))
    with job.transaction() as tx:
        tx.map("m").put_all("k", {uk(i): i for i in range(20_000)})
    after, seen, reads = None, [], []
    while True:
        counts.whole = counts.seek = 0
        with job.transaction() as tx:
            page = tx.map("m").entries_page("k", "", after, 500)
        reads.append(counts.seek)
        assert counts.whole == 0  # no read of the whole map
        seen += [k for k, _v in page.entries]
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == [uk(i) for i in range(20_000)]
    assert max(reads) <= 502  # the page, and one entry to tell whether more follow


def test_a_ttl_map_page_reads_a_bounded_run_of_expired_entries(counted):
    job, counts, clock = counted
    job.register_state(StateDescriptor.from_dict({"name": "m", "kind": "map", "ttl": {"ttl_ms": 100}}))
    with job.transaction() as tx:
        tx.map("m").put_all("k", {f"a{i:05d}": i for i in range(5000)})
    clock.advance(200)
    with job.transaction() as tx:
        tx.map("m").put_all("k", {f"b{i:05d}": i for i in range(10)})
    after, seen, pages_read = None, [], 0
    while True:
        counts.seek = 0
        with job.transaction() as tx:
            page = tx.map("m").entries_page("k", "", after, 10)
        # The budget of one page, one entry to tell whether more follow, and the entries the
        # incremental TTL cleanup deleted ahead of the page (skipped by that look-ahead).
        assert counts.seek <= 2 * 10 + 1000 + 1 + 5
        pages_read += 1
        seen += [k for k, _v in page.entries]
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == [f"b{i:05d}" for i in range(10)] and pages_read > 1
    with job.transaction() as tx:  # the expired entries were dropped as they were read
        assert tx.map("m").entries_page("k", "", None, 10_000).entries == [(f"b{i:05d}", i) for i in range(10)]


def test_a_keys_page_reads_about_a_page(counted):
    job, counts, _clock = counted
    job.register_state(StateDescriptor("m", "map"))
    with job.transaction() as tx:
        for i in range(2000):
            tx.map("m").put_all(f"k{i}", {uk(j): j for j in range(20)})  # 40,000 entries, 2,000 keys
    start_after, listed = None, []
    while True:
        counts.whole = counts.seek = 0
        with job.exclusive():
            keys = list(_take(job.keys("m", "", None, start_after), 100))
        assert counts.whole == 0 and counts.seek <= 100 + 1  # one primary per map, not its entries
        listed += [k.key for k in keys]
        if len(keys) < 100:
            break
        start_after = keys[-1].position
    assert sorted(listed) == sorted(f"k{i}" for i in range(2000)) and len(listed) == 2000


def _take(items, n):
    for i, item in enumerate(items):
        if i == n:
            return
        yield item


# -- the heap's sorted index -------------------------------------------------------------------------


@pytest.mark.parametrize("run", [100, 32_768], ids=["many runs", "one run"])
def test_the_heap_index_matches_a_sorted_model_under_random_writes(monkeypatch, run):
    monkeypatch.setattr(heap_partition, "_RUN", run)
    rng = random.Random(3)
    container = _Container(0, {})
    model: set[bytes] = set()
    for step in range(30_000):
        key = f"{rng.randrange(6000):05d}".encode()
        if rng.random() < 0.6:
            container[key] = b"v"
            model.add(key)
        else:
            container.pop(key, None)
            model.discard(key)
        # A listing reads: rarely at first (the delta grows into runs of its own), then often.
        if step % 2500 == 0 or (step > 20_000 and step % 300 == 0):
            after = f"{rng.randrange(6000):05d}".encode() if rng.random() < 0.7 else None
            assert list(container.keys_after(after)) == sorted(k for k in model if after is None or k > after)
    assert list(container.keys_after(None)) == sorted(model)


def test_the_heap_index_keeps_frozen_views_intact():
    partition = HeapPartition(128)
    job = Job("j", partition)
    job.register_state(StateDescriptor("m", "map"))
    with job.transaction() as tx:
        tx.map("m").put_all("k", {uk(i): i for i in range(3000)})
    with job.transaction() as tx:
        tx.map("m").entries_page("k", "", None, 10)  # builds the map's index
    kg = job.keyspace.key_group("k", job.descriptor("m").key_type)
    view = partition.freeze()
    frozen = list(view.scan("m", kg))
    with job.transaction() as tx:
        tx.map("m").put("k", "u000000a", -1)
        tx.map("m").remove("k", uk(5))
    assert list(view.scan("m", kg)) == frozen  # the copy took the write, not the view's container
    with job.transaction() as tx:
        page = tx.map("m").entries_page("k", "", uk(3).encode(), 4)
    assert [k for k, _v in page.entries] == [uk(4), uk(6), uk(7), uk(8)]
    with job.transaction() as tx:
        page = tx.map("m").entries_page("k", "", None, 2)
    assert [k for k, _v in page.entries] == [uk(0), "u000000a"]
    view.release()


class Watched(dict):
    """A map's entries that count every pass over all of them (iteration, keys, items, values)."""

    passes = 0

    def __iter__(self):
        self.passes += 1
        return super().__iter__()

    def keys(self):
        self.passes += 1
        return super().keys()

    def items(self):
        self.passes += 1
        return super().items()

    def values(self):
        self.passes += 1
        return super().values()


def test_heap_pages_sort_a_map_once_not_per_page():
    partition = HeapPartition(128)
    job = Job("j", partition)
    job.register_state(StateDescriptor("m", "map"))
    with job.transaction() as tx:
        tx.map("m").put_all("k", {uk(i): i for i in range(5000)})
    kg, primary = job.keyspace.locate("k", job.descriptor("m").key_type, "")
    entries = partition._tables["m"].groups[kg].data[primary]
    entries.data = watched = Watched(entries.data)

    def page_all() -> list[str]:
        after, seen = None, []
        while True:
            with job.transaction() as tx:
                page = tx.map("m").entries_page("k", "", after, 100)
            seen += [k for k, _v in page.entries]
            if page.next_after is None:
                return seen
            after = page.next_after

    assert page_all() == [uk(i) for i in range(5000)]
    assert watched.passes == 1  # the index was built by the first page; the other 49 bisect into it
    with job.transaction() as tx:  # new keys go to the index's delta, not a new sort
        tx.map("m").put_all("k", {"u000100x": 0, "zzz": 1})
        tx.map("m").remove("k", uk(7))
    assert page_all() == sorted({uk(i) for i in range(5000)} - {uk(7)} | {"u000100x", "zzz"})
    assert watched.passes == 1
