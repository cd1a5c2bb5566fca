"""Slow and lossy links between the replicas and checkpoint storage: every replica's S3 endpoint
(``STATEHOUSE_S3_ENDPOINT_URL``) is a fault-injecting proxy (tests/support/faulty_proxy.py) in front of
real SeaweedFS, while plain writers append unique ids through the one-key, batch and columnar doors
(tests/support/writers.py).

- Checkpoints: one global checkpoint of a two-replica set per fault (delay and jitter, a narrow
  link, loss-like stalls, connections cut mid-transfer, a link that silently drops everything for a
  while). Each either completes or fails cleanly (the coordinator aborts it everywhere, within its
  timeout and the aborts' round trips, with an error naming the storage or the timeout), and the
  next one over a clean link completes. Then
  every completed checkpoint is restored in turn and compared with an oracle built in plain Python
  from what the writers sent: every write acknowledged before its trigger is in it exactly once,
  nothing sent after it completed is, nothing is doubled.
- A live rescale 2 -> 3 with the storage link slow, stalling and cut from the prepare on: the move
  commits (or, left pending, is resumed once the link is clean), every acknowledged write is present
  exactly once and every key is stored only on its owner.
- A checkpoint over a link that stays silent: the coordinator gives up at its timeout (which bounds
  the trigger's long poll too: tests/client/test_checkpoint_timeout.py), the aborts answer at once,
  and the next checkpoint over a clean link completes.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from statehouse.client import StatehouseClient
from statehouse.client.global_checkpoints import CheckpointCoordinator, CheckpointFailed
from statehouse.client.job import JobClient
from statehouse.client.rescale import LiveRescale, RescaleLeftPending
from tests.support.faulty_proxy import FaultyProxy
from tests.support.replica_set import ReplicaSet, misplaced
from tests.support.s3server import SeaweedS3
from tests.support.writers import Pair, Writers

pytestmark = [pytest.mark.http, pytest.mark.slow]  # ~1-2 minutes each: replica processes, S3, timeouts

JOB, STATE, P = "slowlink", "appended", 128
KEYS = [f"user-{i}" for i in range(120)]
# The coordinator's bound on one checkpoint's uploads: past it the checkpoint is aborted everywhere.
CHECKPOINT_TIMEOUT = 20.0
# One checkpoint call: the upload's wait, the trigger and complete requests (and their retries) and
# the aborts after a failure, on a machine shared with other tests.
CHECKPOINT_BOUND = CHECKPOINT_TIMEOUT + 40.0

# The faults of the storage link, one checkpoint each, and how long each lasts (None: until the
# checkpoint ended). The figures stay below the replica's S3 client bounds for one request (connect
# 5 s, read 30 s, 3 attempts); the silent drop lasts a few seconds, as a link that recovers does,
# but the requests it caught wait for the S3 read timeout, past the coordinator's.
DROP_S = 8.0
FAULTS: list[tuple[str, dict[str, float | bool], float | None]] = [
    ("clean", {}, None),
    ("delay and jitter", {"delay": 0.05, "jitter": 0.1}, None),
    ("narrow link", {"rate": 32_000}, None),
    ("loss-like stalls", {"stall": 0.1, "stall_s": 1.0}, None),
    ("cuts mid-transfer", {"cut": 0.15}, None),
    ("silent drop", {"drop": True}, DROP_S),
]


@pytest.fixture
def link(s3_server: SeaweedS3) -> Iterator[FaultyProxy]:
    """A proxy in front of the session's SeaweedFS, cleared after the test."""
    if s3_server._process is None:
        s3_server.start()
    with FaultyProxy(s3_server.endpoint, seed=11) as proxy:
        yield proxy


def start_set(root: Path, proxy: FaultyProxy, location: str, count: int, **extra: str) -> ReplicaSet:
    """Replicas 0..count-1 (RocksDB: incremental checkpoints, shared SST files) whose S3 is the proxy."""
    storage = {"STATEHOUSE_CHECKPOINT_DIR": location, "STATEHOUSE_S3_ENDPOINT_URL": proxy.url}
    replicas = ReplicaSet(root, storage, extra=dict(extra))
    try:
        replicas.start(count)
        with StatehouseClient(replicas.urls) as client:
            client.create_job(JOB, P).register(STATE, "list")
    except BaseException:
        replicas.stop()
        raise
    return replicas


def add_to_every_key(job: JobClient, value: str) -> None:
    with job.batch() as writes:
        for key in KEYS:
            writes.add(STATE, key, value)


def heal_and_stop(link: FaultyProxy, replicas: ReplicaSet) -> None:
    """A stuck upload waits for its S3 read timeout, and a replica's shutdown for the upload: reset,
    it fails at once and the replicas stop without it."""
    link.set(reset=True)
    link.set()
    replicas.stop()


def sent_count(writers: Writers) -> dict[str, int]:
    """Per writer, how many ids it has acknowledged or given up on: every id it sent before now has a
    number below this plus one request's worth (the request in flight)."""
    return {w.name: len(w.acked) + len(w.unsure) + w.per_request for w in writers.writers}


def number(value: str) -> tuple[str, int]:
    """The writer and sequence number of an id (``batch-17`` -> ``("batch", 17)``)."""
    name, _, n = value.rpartition("-")
    return name, int(n)


@dataclass
class Taken:
    """One completed global checkpoint and what the writers had done around it."""

    checkpoint_id: int
    fault: str
    acked_before: list[Pair]  # acknowledged before the trigger was sent: must be in it
    sent_after: dict[str, int]  # per writer, ids numbered from here were sent after it completed


def read_all(urls: list[str]) -> Counter[Pair]:
    """Every (key, id) the set's live state holds, with how often."""
    with StatehouseClient(urls) as client, client.job(JOB).batch() as reads:
        pending = {key: reads.get(STATE, key) for key in KEYS}
    return Counter((key, value) for key, p in pending.items() for value in p.value or [])


def check_checkpoint(held: Counter[Pair], taken: Taken, sent: set[Pair]) -> None:
    """The oracle of one checkpoint: the writes acknowledged before its trigger, each once; none sent
    after it completed; nothing twice; nothing nobody sent."""
    assert [pair for pair, n in held.items() if n > 1] == [], (taken.fault, "doubled")
    assert [pair for pair in taken.acked_before if held[pair] != 1] == [], (taken.fault, "lost")
    late = [(k, v) for k, v in held if number(v)[1] >= taken.sent_after[number(v)[0]]]
    assert late == [], (taken.fault, "written after the checkpoint completed")
    assert set(held) <= sent, (taken.fault, "nobody sent")


@pytest.mark.long  # make test runs the live rescale over the same link, its checkpoint included
def test_checkpoints_over_a_slow_and_lossy_storage_link(tmp_path: Path, link: FaultyProxy, s3_location: str) -> None:
    proxy = link
    replicas = start_set(tmp_path, proxy, s3_location, 2, STATEHOUSE_NUM_RETAINED="20")
    taken: list[Taken] = []
    outcomes: dict[str, str] = {}
    try:
        with (
            Writers(replicas.urls, replicas.urls, JOB, STATE, KEYS) as writers,
            StatehouseClient(replicas.urls) as client,
        ):
            coordinator = CheckpointCoordinator(client.job(JOB), timeout=CHECKPOINT_TIMEOUT)
            for fault, faults, lasts in FAULTS:
                writers.progress()
                proxy.set(**faults)
                ends = threading.Timer(lasts or 0.0, proxy.set)
                if lasts is not None:
                    ends.start()
                for attempt in ("faulty", "clean"):
                    acked_before = [pair for w in writers.writers for pair in list(w.acked)]
                    started = time.monotonic()
                    try:
                        done = coordinator.checkpoint(metadata={"fault": fault})
                    except CheckpointFailed as exc:
                        # Failed cleanly: within its bound, saying what failed; the next one,
                        # over a clean link, must complete.
                        assert attempt == "faulty", (fault, str(exc))
                        assert "S3" in str(exc) or "not uploaded within" in str(exc), str(exc)
                        outcomes[fault] = f"failed in {time.monotonic() - started:.1f}s: {str(exc)[:160]}"
                        proxy.set()
                        continue
                    finally:
                        assert time.monotonic() - started < CHECKPOINT_BOUND, (fault, attempt)
                    taken.append(Taken(done.checkpoint_id, fault, acked_before, sent_count(writers)))
                    outcomes.setdefault(fault, f"{done.bytes_uploaded} bytes in {time.monotonic() - started:.1f}s")
                    break
                ends.cancel()
                proxy.set()
            writers.progress()
        # Nothing lost or doubled in the live state, whatever the checkpoints met.
        writers.check(replicas.urls)
        sent = {pair for w in writers.writers for pair in (*w.acked, *w.unsure)}
        print(f"storage link: {dict(proxy.counts)}; checkpoints: {outcomes}")  # seen with pytest -s
        assert proxy.counts["cuts"] > 0 and proxy.counts["stalls"] > 0, proxy.counts
        assert [t.fault for t in taken] == [f for f, _, _ in FAULTS], outcomes  # each fault's, or the one after it
        # Each checkpoint holds exactly what was written before it, restored over a slow link.
        with (
            StatehouseClient(replicas.urls) as client,
            proxy.faulty(delay=0.02, jitter=0.05, stall=0.05, stall_s=0.5),
        ):
            coordinator = CheckpointCoordinator(client.job(JOB))
            for checkpoint in taken:
                restored = coordinator.restore(checkpoint.checkpoint_id)
                assert [r["checkpoint_id"] for r in restored] == [checkpoint.checkpoint_id] * 2
                check_checkpoint(read_all(replicas.urls), checkpoint, sent)
        for server in replicas.servers:
            assert "Traceback" not in server.log(), server.log()[-3000:]
    finally:
        replicas.stop()


def test_live_rescale_over_a_slow_and_lossy_storage_link(tmp_path: Path, link: FaultyProxy, s3_location: str) -> None:
    proxy = link
    replicas = start_set(tmp_path, proxy, s3_location, 2)
    seeds = replicas.urls
    steps: list[str] = []
    waited: list[dict[str, Any]] = []

    def progress(step: str, info: dict[str, Any]) -> None:
        steps.append(step)
        if step == "prepared":  # the checkpoint, the loads and the decision over the faulty link
            proxy.set(delay=0.02, jitter=0.05, stall=0.1, stall_s=0.5, cut=0.1)
        elif step == "waiting":
            waited.append(info)

    try:
        new = replicas.add(2, 3, version=2).url
        with Writers(seeds, [*seeds, new], JOB, STATE, KEYS) as writers:
            writers.progress()
            started = time.monotonic()
            with StatehouseClient(seeds) as client, LiveRescale(client, 3, [new], wait=60, progress=progress) as move:
                try:
                    report = move.run()
                except RescaleLeftPending:
                    proxy.set()  # pending: it holds, and finishes once the link is clean
                    report = move.resume()
            proxy.set()
            took = time.monotonic() - started
            writers.progress()
        assert report.outcome == "committed", (report, steps)
        serving = [*seeds, new]
        writers.check(serving)
        assert misplaced(serving, JOB, [STATE], P, count=3) == {STATE: []}
        print(f"storage link: {dict(proxy.counts)}; move {took:.1f}s, waited {waited}")  # seen with pytest -s
        assert proxy.counts["cuts"] > 0, proxy.counts
        for server in replicas.servers:
            assert "Traceback" not in server.log(), server.log()[-3000:]
    finally:
        proxy.set()
        replicas.stop()


def test_a_checkpoint_over_a_link_that_stays_silent_fails_within_its_timeout(
    tmp_path: Path, link: FaultyProxy, s3_location: str
) -> None:
    """The S3 link drops everything and does not recover during the checkpoint: the coordinator gives
    up at its timeout and its abort answers at once on every replica (the stuck upload is left to end
    by itself); over a clean link the next checkpoint completes."""
    proxy = link
    replicas = start_set(tmp_path, proxy, s3_location, 2)
    timeout = 3.0  # the coordinator's bound on the uploads, which the silent link outlasts
    try:
        with StatehouseClient(replicas.urls) as client:
            job = client.job(JOB)
            add_to_every_key(job, "x")
            coordinator = CheckpointCoordinator(job, timeout=timeout)
            coordinator.checkpoint()
            proxy.set(drop=True)
            started = time.monotonic()
            with pytest.raises(CheckpointFailed, match="not uploaded within"):
                coordinator.checkpoint()
            failed_after = time.monotonic() - started
            print(f"a checkpoint over a silent link failed after {failed_after:.1f}s")  # seen with pytest -s
            proxy.set()
            assert coordinator.checkpoint().checkpoint_id == 3
    finally:
        heal_and_stop(proxy, replicas)


def test_one_replicas_checkpoint_over_a_silent_link_fails_with_the_uploads_error(
    tmp_path: Path, link: FaultyProxy, s3_location: str
) -> None:
    """A deployment of one replica triggers and completes in one request (``complete``). Over a link that
    stays silent, its upload fails at the replica's own S3 read timeout (``STATEHOUSE_S3_READ_TIMEOUT_S``,
    one attempt), and its abort then waits out the same timeouts: the trigger answers ``in_progress`` when
    its wait is over rather than holding the request past the client's, so the coordinator reports the
    upload's error, not an unreachable replica; the link back, the next checkpoint completes. The client
    waits 10 s for an answer, less than the upload's failure and its aborts take together."""
    settings = {"STATEHOUSE_S3_READ_TIMEOUT_S": "2", "STATEHOUSE_S3_MAX_ATTEMPTS": "1"}
    replicas = start_set(tmp_path, link, s3_location, 1, **settings)
    try:
        with StatehouseClient(replicas.urls, timeout=10.0) as client:
            job = client.job(JOB)
            add_to_every_key(job, "x")
            coordinator = CheckpointCoordinator(job, timeout=120)
            coordinator.checkpoint()
            add_to_every_key(job, "y")  # new files for the next checkpoint to upload
            link.set(drop=True)
            with pytest.raises(CheckpointFailed) as failed:
                coordinator.checkpoint()
            assert "checkpoint storage (S3) failed to upload" in str(failed.value), failed.value
            assert "Read timeout" in str(failed.value), failed.value
            link.set()
            assert coordinator.checkpoint().checkpoint_id == 3
    finally:
        heal_and_stop(link, replicas)


def test_long_polls_on_a_stuck_upload_hold_no_thread_and_answer_when_it_ends(
    tmp_path: Path, link: FaultyProxy, s3_location: str
) -> None:
    """Many requests wait (``wait_ms``) on one upload that the silent link holds: more of them than the
    replica's worker threads, yet a write answers meanwhile; a short wait answers ``in_progress`` when
    it is over; the upload's end (here its failure at the replica's S3 read timeout) answers every long
    wait at once, well before the wait would have run out."""
    settings = {"STATEHOUSE_S3_READ_TIMEOUT_S": "3", "STATEHOUSE_S3_MAX_ATTEMPTS": "1"}
    replicas = start_set(tmp_path, link, s3_location, 1, **settings)
    waiters, long_wait_ms, short_wait_ms = 60, 10_000, 500  # anyio's worker threads: 40
    try:
        url = f"{replicas.urls[0]}/v1/jobs/{JOB}/checkpoints"
        with StatehouseClient(replicas.urls) as client:
            job = client.job(JOB)
            add_to_every_key(job, "x")
            CheckpointCoordinator(job).checkpoint()  # the replica has listed the storage once
            add_to_every_key(job, "y")
            link.set(drop=True)
            with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=waiters + 2)) as http:
                triggered = http.post(url, json={"checkpoint_id": 2})
                assert triggered.status_code == 202, triggered.text

                def wait(wait_ms: int) -> tuple[str, float]:
                    info = http.get(f"{url}/2", params={"wait_ms": wait_ms}).json()
                    return info["status"], time.monotonic()

                with ThreadPoolExecutor(waiters + 1) as pool:
                    started = time.monotonic()
                    long_waits = [pool.submit(wait, long_wait_ms) for _ in range(waiters)]
                    short_status, short_end = pool.submit(wait, short_wait_ms).result()
                    assert short_status == "in_progress"
                    assert short_end - started >= short_wait_ms / 1000
                    time.sleep(0.5)  # every long wait is in the replica by now
                    assert not any(f.done() for f in long_waits), [f.result() for f in long_waits if f.done()][:3]
                    add_to_every_key(job, "z")  # a write answers while they all wait
                    ended = [f.result() for f in long_waits]
            assert {status for status, _ in ended} == {"failed"}, ended
            ends = [end for _, end in ended]
            assert max(ends) - started < 0.8 * long_wait_ms / 1000, (
                "the waits ran out instead of ending with the upload"
            )
            assert max(ends) - min(ends) < 2.0, "the waits did not all end with the upload"
    finally:
        heal_and_stop(link, replicas)
