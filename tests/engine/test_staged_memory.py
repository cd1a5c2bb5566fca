"""Everything a task attempt holds is charged to STATEHOUSE_MAX_STAGED_BYTES: the
timers its advances fire and the answers kept for re-sent requests, not only its writes; and an
abort gives the memory back. Over real HTTP; peak and held RSS measured."""

from __future__ import annotations

import contextlib
import signal

import httpx
import pytest

from tests.support.problems import problem
from tests.support.process_memory import MB, memory
from tests.support.server import start_server

pytestmark = [pytest.mark.http, pytest.mark.slow]

TIMERS = 10_000
KEY = "k" * 4000  # 4 KB keys: each fired timer holds ~4 KB three times over


@contextlib.contextmanager
def own_server(server, tmp_path, timers: int):
    """A server of the session's backend to itself (RSS measured), with job ``t``, ``timers``
    event timers of 4 KB keys registered, and epoch 1 fenced."""
    backend = server.settings["STATEHOUSE_BACKEND"]
    srv = start_server(tmp_path / "staged", {"STATEHOUSE_BACKEND": backend})
    try:
        with httpx.Client(base_url=srv.url + "/v1", timeout=120) as client:
            client.put("/jobs/t", json={"max_parallelism": 128}).raise_for_status()
            for start in range(0, timers, 2_000):
                ops = [
                    {"op": "register_timer", "domain": "event", "key": f"{KEY}{i}", "timestamp": 10}
                    for i in range(start, min(start + 2_000, timers))
                ]
                client.post("/jobs/t/batch", json={"ops": ops}).raise_for_status()
            client.post("/jobs/t/fence", json={"epoch": 1}).raise_for_status()
            yield srv, client
    finally:
        srv.stop(signal.SIGKILL)


@pytest.fixture
def staged(server, tmp_path):
    """:func:`own_server` with 10,000 timers: each advance fires ~120 MB."""
    with own_server(server, tmp_path, TIMERS) as served:
        yield served


@pytest.fixture
def fenced(server, tmp_path):
    """:func:`own_server` without timers (registering 10,000 costs seconds a read test needs not)."""
    with own_server(server, tmp_path, 0) as served:
        yield served


def advance(client, attempt: str, seq: int = 0):
    body = {"to": 100, "epoch": 1, "partition": int(attempt[1:]), "attempt": attempt, "seq": seq}
    return client.post("/jobs/t/timers/event/advance", json=body)


def accounted(client) -> int:
    return sum(a["bytes"] for a in client.get("/jobs/t/epochs/1").json()["attempts"])


def test_staged_advances_are_charged_and_freed_on_abort(staged):
    """Before: 40 attempts' advances of 10,000 timers with 4 KB keys added 3.1 GB of RSS while
    GET /epochs/1 accounted 0.02 MB, and 3.2 GB stayed after the abort."""
    srv, client = staged
    pid = srv.process.pid
    before = memory(pid)["VmRSS"]
    fired = []
    for n in range(40):
        r = advance(client, f"a{n}")
        if r.status_code != 200:
            body = problem(r, 413, "staging_too_large")
            assert "STATEHOUSE_MAX_STAGED_BYTES" in body["detail"], body
            break
        fired.append(len(r.json()["timers"]))
    assert fired and set(fired) == {TIMERS}, fired
    assert len(fired) < 40  # the limit (256 MiB) stopped them
    held = accounted(client)
    grown = memory(pid)["VmRSS"] - before
    print(f"attempts {len(fired)}, accounted {held / MB:.0f} MB, RSS grown {grown / MB:.0f} MB")
    assert held <= 256 << 20
    assert held >= 0.5 * grown, (held, grown)  # the accounting covers what staging holds
    # A re-sent request is answered again (what the accounting kept for it), not fired twice.
    again = advance(client, "a0")
    assert again.status_code == 200 and len(again.json()["timers"]) == TIMERS
    assert accounted(client) == held
    client.post("/jobs/t/epochs/1/abort").raise_for_status()
    assert client.get("/jobs/t/epochs/1").json()["attempts"] == []
    kept = memory(pid)["VmRSS"] - before
    print(f"RSS kept after the abort {kept / MB:.0f} MB")
    assert kept < max(0.25 * grown, 64 * MB), (kept, grown)


def test_kept_answers_are_charged(fenced):
    """A task attempt's reads keep their answer for a re-sent request: charged too, and
    replaced (not added) by the attempt's next request."""
    _srv, client = fenced
    client.put("/jobs/t/states/v", json={"kind": "value"}).raise_for_status()
    client.put("/jobs/t/states/v/keys/big", json={"value": "x" * 1_000_000}).raise_for_status()
    read = {"ops": [{"op": "get", "state": "v", "key": "big"}] * 10, "epoch": 1, "partition": 0, "attempt": "r"}
    assert client.post("/jobs/t/batch", json={**read, "seq": 0}).status_code == 200
    assert accounted(client) >= 10_000_000
    assert client.post("/jobs/t/batch", json={**read, "seq": 1, "ops": read["ops"][:1]}).status_code == 200
    assert 1_000_000 <= accounted(client) < 2_000_000
