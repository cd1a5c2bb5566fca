"""A client's URLs are seeds, and a client follows its replica set through live rescales by itself
(client/replicas.py), over real RocksDB replicas sharing one checkpoint directory:

- 32 long-lived clients, one per thread, over the three doors (batches, columnar calls, one-key
  calls), keep writing while an operator grows the set 2 -> 3 and shrinks it back from outside:
  each keeps succeeding after each commit, routes by the new layout, and every acknowledged add
  is present once, on its owner only;
- after a shrink, with the removed replica stopped and its data deleted, a new process configured
  with the original URLs works; a retired replica as a seed is skipped;
- seeds in any order, one enough, a dead one skipped; URLs of two sets refused in one line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from statehouse.client import ClientConfig, LayoutError, StatehouseClient, Unavailable
from statehouse.client.rescale import LiveRescale
from statehouse.protocol.keygroups import KeyGroupAssigner, operator_index
from tests.support.replica_set import ReplicaSet, misplaced
from tests.support.server import free_port, start_server

pytestmark = [pytest.mark.http, pytest.mark.slow]  # replica sets that grow and shrink

JOB = "seeded"
STATE = "count"
P = 64
WRITERS = 32
KEYS_PER_WRITER = 3
RESCALE_WAIT = 60.0  # the writers' ClientConfig.rescale_wait: each recovers within it after a commit


def rescaled(urls: list[str], to: int, new: list[str] | None = None) -> None:
    """A live rescale run from outside the writers' process state: its own client, as an operator's."""
    with StatehouseClient(urls) as admin, LiveRescale(admin, to, new, wait=120) as move:
        assert move.run().outcome == "committed"


# -- 32 long-lived clients through a grow and a shrink ----------------------------------------------


class Writer(threading.Thread):
    """One long-lived client adding 1 to each of its own keys in a loop, through one door: ``added``
    counts the acknowledged adds per key, ``rounds`` the rounds done, ``routes`` the replicas its
    client routed by in the last one; the first error ends it (none is expected)."""

    def __init__(self, index: int, seeds: list[str], start: threading.Barrier) -> None:
        super().__init__(name=f"writer-{index}", daemon=True)
        self.door = ("batch", "columnar", "one-key")[index % 3]
        self.seeds, self.start_together = seeds, start
        self.keys = [f"w{index}-k{i}" for i in range(KEYS_PER_WRITER)]
        self.added: Counter[str] = Counter()
        self.rounds = 0
        self.routes = 0
        self.error: str | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        self.start_together.wait()
        try:
            with StatehouseClient(ClientConfig.of(self.seeds, rescale_wait=RESCALE_WAIT)) as client:
                job = client.job(JOB)
                one_key = job.reducing_state(STATE)
                while not self.stop.is_set():
                    if self.door == "batch":
                        with job.batch() as batch:
                            for key in self.keys:
                                batch.add(STATE, key, 1)
                        self.added.update(self.keys)
                    elif self.door == "columnar":
                        assert job.columns().add(STATE, self.keys, 1) == len(self.keys)
                        self.added.update(self.keys)
                    else:
                        for key in self.keys:
                            one_key.add(key, 1)
                            self.added[key] += 1
                    self.routes = len(client.replicas)
                    self.rounds += 1
                    # Up to 10 rounds a second each: 32 writers still write through every step of
                    # the move, and leave the replicas and the driver (this process) CPU for it.
                    time.sleep(0.1)
        except Exception as exc:  # the assertions show it
            self.error = f"{self.door}: {type(exc).__name__}: {exc}"


def made_elsewhere(urls: list[str]) -> None:
    """The job and its state, made through plain HTTP as another process would: this process knows
    nothing of the set or the job, so the writers' clients, opened at once, learn the layout
    themselves and some take the job from another one's read (the process's cache)."""
    for url in urls:
        httpx.put(f"{url}/v1/jobs/{JOB}", json={"max_parallelism": P}, timeout=30).raise_for_status()
        body = {"kind": "reducing", "function": "sum", "value_type": "int64"}
        httpx.put(f"{url}/v1/jobs/{JOB}/states/{STATE}", json=body, timeout=30).raise_for_status()


def each_progresses(writers: list[Writer]) -> None:
    """Every writer finishes a round begun after now (so after the last commit) within the config's
    rescale_wait; none failed."""
    started = [w.rounds for w in writers]
    deadline = time.monotonic() + RESCALE_WAIT
    while True:
        assert {w.name: w.error for w in writers if w.error} == {}
        behind = [(w.name, w.door, w.rounds) for w, s in zip(writers, started, strict=True) if w.rounds < s + 2]
        if not behind:
            return
        assert time.monotonic() < deadline, f"not progressing: {behind}"
        time.sleep(0.1)


def on_replica_2(writer: Writer) -> bool:
    """Whether one of the writer's keys is replica 2's among 3 (its client must route there to
    succeed after the grow; and learn the shrink, which retires replica 2, to succeed after it).
    A client whose keys all stay where they were has no refusal to learn a new layout from."""
    assign = KeyGroupAssigner(P)
    return any(operator_index(P, 3, assign(key, "string")) == 2 for key in writer.keys)


@pytest.fixture
def replica_set(tmp_path: Path) -> Iterator[ReplicaSet]:
    replicas = ReplicaSet(tmp_path / "replicas", {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")})
    try:
        yield replicas
    finally:
        replicas.stop()


def test_long_lived_clients_keep_writing_through_a_grow_and_a_shrink(replica_set):
    seeds = replica_set.start(2)
    made_elsewhere(seeds)
    start = threading.Barrier(WRITERS)
    writers = [Writer(i, seeds, start) for i in range(WRITERS)]
    for writer in writers:
        writer.start()
    try:
        each_progresses(writers)
        new = replica_set.add(2, 3, version=2).url  # the operator starts the new replica, then moves
        rescaled(seeds, 3, [new])
        each_progresses(writers)
        moved = [w for w in writers if on_replica_2(w)]
        assert moved and {w.routes for w in moved} == {3}  # configured with 2 URLs: route to 3, no restart
        rescaled(seeds, 2)
        each_progresses(writers)
        assert {w.routes for w in moved} == {2}
    finally:
        for writer in writers:
            writer.stop.set()
        for writer in writers:
            writer.join(RESCALE_WAIT)
    assert {w.name: w.error for w in writers if w.error} == {}
    assert [w.name for w in writers if w.is_alive()] == []

    acknowledged = sum((w.added for w in writers), Counter[str]())
    with StatehouseClient(seeds) as client:
        totals = client.job(JOB).columns().get(STATE, list(acknowledged))
    assert dict(zip(acknowledged, totals.tolist(), strict=True)) == dict(acknowledged)  # each add once
    assert misplaced([*seeds, new], JOB, [STATE], P, 2) == {STATE: []}


# -- after a shrink: the original URLs, a retired seed, a removed one --------------------------------

KEYS = [f"user-{i}" for i in range(60)]


@dataclass
class Shrunk:
    """A set grown 2 -> 3 and shrunk back, every key written before: the original three URLs
    (the third one's replica retired by the shrink), the set itself, and each key's value."""

    urls: list[str]
    replicas: ReplicaSet
    expected: dict[str, int]


@pytest.fixture(scope="module")
def shrunk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shrunk]:
    root = tmp_path_factory.mktemp("shrunk")
    replicas = ReplicaSet(root / "replicas", {"STATEHOUSE_CHECKPOINT_DIR": str(root / "checkpoints")})
    try:
        seeds = replicas.start(2)
        expected = {key: i for i, key in enumerate(KEYS)}
        with StatehouseClient(seeds) as client:
            job = client.create_job(JOB, P)
            job.register("v", "value", value_type="int64")
            job.value_state("v").put_many(list(expected), list(expected.values()))
        new = replicas.add(2, 3, version=2).url
        rescaled(seeds, 3, [new])
        rescaled(seeds, 2)
        yield Shrunk([*seeds, new], replicas, expected)
    finally:
        replicas.stop()


def values(urls: list[str]) -> dict[str, int]:
    with StatehouseClient(urls) as client:
        return dict(zip(KEYS, client.job(JOB).columns().get("v", KEYS).tolist(), strict=True))


NEW_PROCESS = """
import json, sys
from statehouse.client import StatehouseClient

urls, keys = json.loads(sys.argv[1]), json.loads(sys.argv[2])
with StatehouseClient(urls) as client:
    job = client.job("seeded")
    got = dict(zip(keys, job.columns().get("v", keys).tolist()))
    state = job.value_state("v")
    state.update(keys[0], -1)  # a write through the layout it learned, read back by the test
    print(json.dumps({"routes": client.replicas.urls, "values": got}))
"""


def test_the_original_urls_work_after_a_shrink_once_the_removed_replica_is_gone(shrunk):
    kept, removed = shrunk.urls[:2], shrunk.urls[2]
    assert httpx.get(f"{removed}/v1/topology", timeout=30).json()["retired"]
    with StatehouseClient([removed]) as client:  # a retired replica alone: it names the set's URLs
        assert client.topology() and client.replicas.urls == kept
    assert values(shrunk.urls) == shrunk.expected

    server = shrunk.replicas.servers.pop()  # stopped, its data deleted, as docs/operations.md says
    server.stop()
    shutil.rmtree(server.log_path.parent)
    # A new process: nothing of this one's layout cache helps it.
    arguments = [json.dumps(shrunk.urls), json.dumps(KEYS)]
    done = subprocess.run([sys.executable, "-c", NEW_PROCESS, *arguments], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["routes"] == kept and answer["values"] == shrunk.expected
    shrunk.expected[KEYS[0]] = -1
    assert values(kept) == shrunk.expected
    assert misplaced(kept, JOB, ["v"], P, 2) == {"v": []}


def test_seeds_in_any_order_one_enough_a_dead_one_skipped(shrunk, tmp_path):
    kept = shrunk.urls[:2]
    dead = f"http://127.0.0.1:{free_port()}"
    for seeds in ([kept[1], kept[0]], [kept[0]], [kept[1]], [dead, kept[1]], [shrunk.urls[2], dead, *kept[::-1]]):
        with StatehouseClient(seeds) as client:
            assert [t["replica_index"] for t in client.topology()] == [0, 1]
            assert client.replicas.urls == kept, seeds
        assert values(seeds) == shrunk.expected
    with StatehouseClient([dead]) as client, pytest.raises(Unavailable) as nobody:
        client.topology()
    assert f"{dead} did not answer GET /v1/topology" in str(nobody.value)

    other = start_server(tmp_path / "other", {"STATEHOUSE_BACKEND": "rocksdb"})  # its own storage: another set
    try:
        with StatehouseClient([kept[0], other.url]) as client, pytest.raises(LayoutError) as mixed:
            client.topology()
        assert "the URLs are replicas of different replica sets" in str(mixed.value)
        assert "\n" not in str(mixed.value)
    finally:
        other.stop()
