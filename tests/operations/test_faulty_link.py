"""Micro-batches over a slow and lossy link (tests/support/faulty_proxy.py between the client and a
replica): added delay and jitter, answers swallowed after the replica acted on a staged write, on an
epoch commit and on a fence, every connection reset mid-batch, and a link that silently drops
everything for a while. No call hangs past its timeout and retries, and the state ends exact:
every batch applied once, none lost, none doubled. A batch that fails is re-run as a Spark driver
would (its next begin is a replay when its commit went through). CI-sized: one replica, heap; ``make test-long``
runs 200 batches with faults drawn at random."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest

from statehouse.client import StatehouseClient
from statehouse.client.coordinator import MicroBatchCoordinator
from statehouse.client.errors import StatehouseError
from tests.support.faulty_proxy import FaultyProxy
from tests.support.micro_batches import KEYS, task, totals
from tests.support.server import start_server

pytestmark = [pytest.mark.http, pytest.mark.slow]  # requests through a lossy proxy

JOB = "link"
TIMEOUT, RETRIES = 2.0, 3
# One call: its timeout per try, retried RETRIES times with a little backoff; a batch makes a
# handful of calls and may be re-run a few times.
CALL_BOUND = TIMEOUT * (RETRIES + 1) + 2
BATCH_BOUND = 8 * CALL_BOUND


@pytest.fixture
def link(tmp_path):
    server = start_server(tmp_path, {"STATEHOUSE_BACKEND": "heap"})
    try:
        with FaultyProxy(server.url, seed=7) as proxy:
            yield proxy
    finally:
        server.stop()
    assert "Traceback" not in server.log()


def drop_for(proxy: FaultyProxy, seconds: float) -> Callable[[], None]:
    """Drop everything from now for ``seconds`` (a thread clears it)."""

    def fault() -> None:
        proxy.set(drop=True)
        threading.Timer(seconds, proxy.set).start()

    return fault


def faults_of(proxy: FaultyProxy) -> list[tuple[str, Callable[[], None]]]:
    """Each fault of the link by name, as a call that sets it on ``proxy``."""
    path = f"/v1/jobs/{JOB}"
    return [
        ("clean", proxy.set),
        ("delay and jitter", lambda: proxy.set(delay=0.05, jitter=0.1)),
        ("staged write's answer lost", lambda: proxy.swallow(f"POST {path}/batch")),
        ("epoch commit's answer lost", lambda: proxy.swallow(f"POST {path}/epochs/")),
        ("fence's answer lost", lambda: proxy.swallow(f"POST {path}/fence")),
        ("every connection reset", lambda: proxy.set(reset=True)),
        ("silent drop", drop_for(proxy, TIMEOUT * 1.5)),
        ("slow link", lambda: proxy.set(delay=0.2)),
    ]


def run_batches(proxy: FaultyProxy, faults: list[tuple[str, Callable[[], None]]]) -> None:
    """One micro-batch per fault, each re-run as a driver would until it goes through, every call
    and batch within its bound; then the state is exact: every batch applied once."""
    reruns: dict[str, int] = {}
    with StatehouseClient([proxy.url], timeout=TIMEOUT, retries=RETRIES) as client:
        job = client.create_job(JOB, 128)
        job.register("total", "reducing", function="sum")
        coordinator = MicroBatchCoordinator(job)
        for batch_id, (name, fault) in enumerate(faults):
            fault()
            if name == "every connection reset":
                proxy.set()  # existing connections are gone: the batch meets reconnections
            started = time.monotonic()
            for _ in range(8):
                call = time.monotonic()
                try:
                    plan = coordinator.begin(batch_id)
                    if not plan.replay:
                        coordinator.commit(plan, [task(job, plan, 0, 1)])
                    break
                except StatehouseError:
                    reruns[name] = reruns.get(name, 0) + 1
                finally:
                    assert time.monotonic() - call < BATCH_BOUND, (name, time.monotonic() - call)
            else:
                pytest.fail(f"batch {batch_id} ({name}) never went through: {reruns}")
            assert time.monotonic() - started < BATCH_BOUND * 2, name
            proxy.set()
        assert proxy.swallows_pending() == 0  # every lost answer happened
        # Exact: each of the batches applied once, whatever was lost or resent.
        assert set(totals(job, KEYS).values()) == {len(faults)}, (totals(job, KEYS), reruns)
        assert coordinator.applied().batch_id == len(faults) - 1
        print(f"faulty link: {dict(proxy.counts)}, batches re-run: {reruns}")  # seen with pytest -s


def test_micro_batches_over_a_faulty_link_apply_exactly_once(link):
    """Every fault once, in order."""
    run_batches(link, faults_of(link))
    assert link.counts["swallowed"] == 3 and link.counts["resets"] >= 3, link.counts


@pytest.mark.long
def test_micro_batches_over_a_faulty_link_at_length(link):
    """200 micro-batches, each meeting a fault drawn at random (seeded) from the same list."""
    faults = faults_of(link)
    draw = random.Random(11)
    run_batches(link, [draw.choice(faults) for _ in range(200)])
