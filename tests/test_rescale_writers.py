"""Writers outside Spark during a live rescale (issue 30): plain clients append unique ids from threads
through the one-key endpoint (raw HTTP, following 421 and 503 as the contract says), the batch endpoint
and the columnar endpoint (the Python client), while the set is rescaled 2 -> 3 (LiveRescale) and
back 3 -> 2 (``statehouse rescale --to 2``). No writer sees an error (refusals are retried on the new layout);
afterwards every acknowledged write is present exactly once, nothing is present twice or unsent, and
every key is stored only on its owner under the final layout. On both backends: the heap's move is
the same protocol over state that lives in memory.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from harness.replica_set import ReplicaSet, misplaced
from statehouse.client import StatehouseClient
from statehouse.client.rescale import LiveRescale
from tests.test_cli import cli

pytestmark = [pytest.mark.http, pytest.mark.slow]  # 25-45 s per backend: three replica processes, two moves

JOB = "writers"
STATE = "appended"
MAX_PARALLELISM = 128
KEYS = [f"user-{i}" for i in range(120)]
PROGRESS = 25  # acknowledged writes each writer makes between the steps
PROGRESS_LIMIT = 180.0  # a ceiling for writers that stopped making progress, not a timed assertion


class Writer(threading.Thread):
    """Appends unique ids to random keys until stopped: ``acked`` (key, id) pairs the server acknowledged,
    ``unsure`` ones whose request failed without a clear answer (applied at most once)."""

    def __init__(self, name: str, write: Callable[[list[tuple[str, str]]], None], per_request: int) -> None:
        super().__init__(name=name, daemon=True)
        self.write, self.per_request = write, per_request
        self.acked: list[tuple[str, str]] = []
        self.unsure: list[tuple[str, str]] = []
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.rng = random.Random(name)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            pairs = [(self.rng.choice(KEYS), f"{self.name}-{n + i}") for i in range(self.per_request)]
            n += self.per_request
            try:
                self.write(pairs)
            except Exception as exc:  # recorded: the assertions show it
                self.unsure += pairs
                self.failures.append(f"{type(exc).__name__}: {exc}")
            else:
                self.acked += pairs


class OneKey:
    """A plain HTTP client of the one-key endpoint. It sends a write to a replica of the layout it knows
    (``serving``); a 421 goes to the owner it names (the owner's URL, or the replica of ``every`` that
    reports that index at that version), a 503 ``rescale_in_progress`` is retried after ``Retry-After``;
    either refusal guarantees the write was not applied, so it is re-sent as it is."""

    def __init__(self, serving: list[str], every: list[str]) -> None:
        self.serving, self.urls = serving, every
        self.http = httpx.Client(timeout=60)
        self.refused = Counter[int]()  # by status: in a failure's message, how much the move refused

    def owner(self, version: int, index: int) -> str | None:
        for url in self.urls:
            try:
                shown = self.http.get(f"{url}/v1/topology").json()
            except httpx.TransportError:
                continue
            serving = not shown.get("retired") and not (shown.get("move") or {}).get("joining", False)
            if (shown["version"], shown["replica_index"]) == (version, index) and serving:
                return url
        return None

    def __call__(self, pairs: list[tuple[str, str]]) -> None:
        for key, value in pairs:
            url = random.choice(self.serving)
            for _attempt in range(1000):
                response = self.http.post(f"{url}/v1/jobs/{JOB}/states/{STATE}/keys/{key}/add", json={"value": value})
                if response.status_code == 204:
                    break
                problem = response.json()
                self.refused[response.status_code] += 1
                if response.status_code == 421:
                    named = problem.get("owner_url") or self.owner(problem["version"], problem["owner"])
                    url = named or random.choice(self.serving)
                    if named is None:
                        time.sleep(0.05)  # the layout that names the owner is being committed
                elif response.status_code == 503 and problem["code"] == "rescale_in_progress":
                    time.sleep(float(response.headers.get("Retry-After", "1")))
                else:
                    raise AssertionError(f"{response.status_code} {response.text}")
            else:
                raise AssertionError(f"{key}: never acknowledged")


@pytest.fixture(params=["rocksdb", "heap"])
def replicas(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ReplicaSet]:
    storage = {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    replica_set = ReplicaSet(tmp_path / "replicas", storage, backend=request.param)
    try:
        yield replica_set
    finally:
        replica_set.stop()


def progress(writers: list[Writer]) -> None:
    """Until each writer has made PROGRESS more acknowledged writes."""
    targets = [len(w.acked) + PROGRESS for w in writers]
    deadline = time.monotonic() + PROGRESS_LIMIT
    while any(len(w.acked) < t for w, t in zip(writers, targets, strict=True)):
        stuck = [(w.name, len(w.acked), w.failures[-3:]) for w in writers]
        assert time.monotonic() < deadline and all(w.is_alive() for w in writers), stuck
        time.sleep(0.05)


def test_every_acknowledged_write_is_present_exactly_once(replicas: ReplicaSet) -> None:
    seeds = replicas.start(2)
    new = replicas.add(2, 3, version=2)
    with StatehouseClient(seeds) as client:
        client.create_job(JOB, MAX_PARALLELISM).register(STATE, "list")

    one_key = OneKey(seeds, [*seeds, new.url])
    clients = [StatehouseClient(seeds) for _ in range(2)]
    batch_job, columns_job = (c.job(JOB) for c in clients)

    def batch(pairs: list[tuple[str, str]]) -> None:
        with batch_job.batch() as b:
            for key, value in pairs:
                b.add(STATE, key, value)

    def columns(pairs: list[tuple[str, str]]) -> None:
        columns_job.columns().add(STATE, [k for k, _v in pairs], [v for _k, v in pairs])

    writers = [
        Writer("one-key-a", one_key, 1),
        Writer("one-key-b", one_key, 1),
        Writer("batch", batch, 8),
        Writer("columnar", columns, 16),
    ]
    try:
        for writer in writers:
            writer.start()
        progress(writers)
        with StatehouseClient(seeds) as client:
            LiveRescale(client, to=3, new_urls=[*seeds, new.url]).run()
        progress(writers)
        cli("rescale", "--to", "2", urls=seeds)  # the operator's way: statehouse rescale, live by default
        progress(writers)
    finally:
        for writer in writers:
            writer.stop.set()
        for writer in writers:
            writer.join(60)
        for c in clients:
            c.close()

    with StatehouseClient(seeds) as client:
        assert len(client.job(JOB).replicas) == 2
        with client.job(JOB).batch() as reads:
            pending = {key: reads.get(STATE, key) for key in KEYS}
    present = Counter((key, value) for key, p in pending.items() for value in p.value or [])
    acked = Counter(pair for w in writers for pair in w.acked)
    unsure = {pair for w in writers for pair in w.unsure}
    assert sum(acked.values()) >= 3 * PROGRESS * len(writers), one_key.refused
    assert {w.name: w.failures for w in writers if w.failures} == {}  # refusals were retried, never surfaced
    assert [pair for pair, n in acked.items() if n > 1] == []  # ids are unique
    assert [pair for pair in acked if present[pair] != 1] == [], "acknowledged writes lost or doubled"
    assert [pair for pair, n in present.items() if n > 1] == [], "writes applied twice"
    assert set(present) <= set(acked) | unsure, "writes present that nobody sent"
    assert misplaced([*seeds, new.url], JOB, [STATE], MAX_PARALLELISM, count=2) == {STATE: []}
