"""Writers outside Spark during a live rescale, for the tests that check no write is lost:
plain clients append unique ids to a list state from threads through the one-key endpoint (raw HTTP,
following 421 and 503 as the contract says), the batch endpoint and the columnar endpoint (the Python
client). Afterwards every acknowledged write must be present exactly once, nothing twice, nothing
that nobody sent (:meth:`Writers.check`).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable

import httpx

from statehouse.client import StatehouseClient

PROGRESS = 25  # acknowledged writes each writer makes per progress() call
PROGRESS_LIMIT = 180.0  # a ceiling for writers that stopped making progress, not a timed assertion

Pair = tuple[str, str]  # (key, the unique id appended to it)


class Writer(threading.Thread):
    """Appends unique ids to random keys until stopped: ``acked`` (key, id) pairs the server acknowledged,
    ``unsure`` ones whose request failed without a clear answer (applied at most once)."""

    def __init__(self, name: str, write: Callable[[list[Pair]], None], per_request: int, keys: list[str]) -> None:
        super().__init__(name=name, daemon=True)
        self.write, self.per_request, self.keys = write, per_request, keys
        self.acked: list[Pair] = []
        self.unsure: list[Pair] = []
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.rng = random.Random(name)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            pairs = [(self.rng.choice(self.keys), f"{self.name}-{n + i}") for i in range(self.per_request)]
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
    reports that index at that version), a 503 ``rescale_in_progress`` is retried after its
    ``retry_after_ms`` (``Retry-After``, in whole seconds, if it has none); either refusal guarantees
    the write was not applied, so it is re-sent as it is."""

    def __init__(self, serving: list[str], every: list[str], job: str, state: str) -> None:
        self.serving, self.urls, self.job, self.state = serving, every, job, state
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

    def __call__(self, pairs: list[Pair]) -> None:
        for key, value in pairs:
            url = random.choice(self.serving)
            for _attempt in range(5000):  # a move frozen for minutes, retried every 200 ms
                response = self.http.post(
                    f"{url}/v1/jobs/{self.job}/states/{self.state}/keys/{key}/add", json={"value": value}
                )
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
                    after_ms = problem.get("retry_after_ms")
                    after = after_ms / 1000 if after_ms is not None else float(response.headers.get("Retry-After", "1"))
                    time.sleep(after)
                else:
                    raise AssertionError(f"{response.status_code} {response.text}")
            else:
                raise AssertionError(f"{key}: never acknowledged")


class Writers:
    """Four writers of ``state`` (a list state of ``job``) over ``keys``: two through the one-key door,
    one through batches, one through the columnar door; ``seeds`` are the serving replicas' URLs,
    ``every`` also the ones a move adds (the one-key writers look owners up there). A context: the
    writers run inside it, and are stopped and joined on leaving it."""

    def __init__(self, seeds: list[str], every: list[str], job: str, state: str, keys: list[str]) -> None:
        self.seeds, self.job_name, self.state, self.keys = seeds, job, state, keys
        self.one_key = OneKey(seeds, every, job, state)
        self.clients = [StatehouseClient(seeds) for _ in range(2)]
        batch_job, columns_job = (c.job(job) for c in self.clients)

        def batch(pairs: list[Pair]) -> None:
            with batch_job.batch() as b:
                for key, value in pairs:
                    b.add(state, key, value)

        def columns(pairs: list[Pair]) -> None:
            columns_job.columns().add(state, [k for k, _v in pairs], [v for _k, v in pairs])

        self.writers = [
            Writer("one-key-a", self.one_key, 1, keys),
            Writer("one-key-b", self.one_key, 1, keys),
            Writer("batch", batch, 8, keys),
            Writer("columnar", columns, 16, keys),
        ]
        self.rounds = 0

    def __enter__(self) -> Writers:
        for writer in self.writers:
            writer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for writer in self.writers:
            writer.stop.set()
        for writer in self.writers:
            writer.join(60)
        for client in self.clients:
            client.close()
        self.one_key.http.close()

    def progress(self) -> None:
        """Until each writer has made PROGRESS more acknowledged writes."""
        self.rounds += 1
        targets = [len(w.acked) + PROGRESS for w in self.writers]
        deadline = time.monotonic() + PROGRESS_LIMIT
        while any(len(w.acked) < t for w, t in zip(self.writers, targets, strict=True)):
            stuck = [(w.name, len(w.acked), w.failures[-3:]) for w in self.writers]
            assert time.monotonic() < deadline and all(w.is_alive() for w in self.writers), stuck
            time.sleep(0.05)

    def check(self, urls: list[str]) -> None:
        """Once stopped: read every key back through a client of ``urls`` (the serving layout); every
        acknowledged write is there exactly once, nothing twice, nothing nobody sent, no writer saw an error."""
        with StatehouseClient(urls) as client, client.job(self.job_name).batch() as reads:
            pending = {key: reads.get(self.state, key) for key in self.keys}
        present = Counter((key, value) for key, p in pending.items() for value in p.value or [])
        acked = Counter(pair for w in self.writers for pair in w.acked)
        unsure = {pair for w in self.writers for pair in w.unsure}
        assert sum(acked.values()) >= self.rounds * PROGRESS * len(self.writers), self.one_key.refused
        failures = {w.name: w.failures[:3] for w in self.writers if w.failures}
        assert failures == {}, failures  # refusals were retried
        assert [pair for pair, n in acked.items() if n > 1] == []  # ids are unique
        assert [pair for pair in acked if present[pair] != 1] == [], "acknowledged writes lost or doubled"
        assert [pair for pair, n in present.items() if n > 1] == [], "writes applied twice"
        assert set(present) <= set(acked) | unsure, "writes present that nobody sent"
