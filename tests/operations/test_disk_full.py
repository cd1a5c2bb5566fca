"""A full data volume is a state, not a 500, on a real small filesystem (a tmpfs).

Before: writes answered 500 ``internal_error`` and ``/readyz`` 200; after space was freed the job
stayed unwritable (RocksDB stops after a failed write until it is reopened); after a restart with
little space it could not even be read (replaying the write-ahead log writes table files first).
Now: writes are refused with 507 ``insufficient_storage`` below ``STATEHOUSE_DISK_RESERVE_BYTES``,
``/readyz`` answers 503 meanwhile and 200 again by itself once space is freed, the job takes
writes again without a restart, a restart with little space still serves reads, and every
acknowledged write is there throughout (the oracle: a dict of what was acknowledged).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from statehouse.backends.rocksdb.space import wal_limit
from tests.support.arrow_ipc import ARROW, arrow, values
from tests.support.checkpoint_status import wait_status
from tests.support.server import ServerProcess, start_server

pytestmark = [pytest.mark.http, pytest.mark.slow]  # volumes filled and freed

VOLUME_MB = 48
RESERVE = 8 << 20
JOB = "/v1/jobs/j"
WAIT_S = 30  # a bound on waiting for the periodic check (every second), not a timing assertion


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of VOLUME_MB mounted for the test (skips where mounting is impossible)."""
    mount = tmp_path / "volume"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) here: cannot make a small filesystem to fill")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={VOLUME_MB}m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {VOLUME_MB} MB tmpfs (needs root; CI runs as root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave: int) -> None:
    """Write a filler file so that about ``leave`` bytes stay free."""
    size = max(0, free_bytes(path.parent) - leave)
    chunk = b"\0" * (64 << 10)
    with open(path, "ab") as f:
        try:
            for _ in range(size // len(chunk)):
                f.write(chunk)
                f.flush()
        except OSError as exc:  # RocksDB took some meanwhile: the volume is as full as it gets
            assert exc.errno == errno.ENOSPC


def settle(path: Path) -> None:
    """Wait (bounded) until RocksDB's background work stops changing the free space."""
    for _ in range(100):
        before = free_bytes(path)
        time.sleep(0.3)
        if free_bytes(path) == before:
            return


def keep_full(server: ServerProcess, writer: Writer, filler: Path, volume: Path, leave: int) -> None:
    """Fill the volume until it stays full, with the job refusing writes.

    A flush or compaction running on frees space as it ends (its log or inputs deleted, or its
    partial output after it failed for lack of space). Without a reserve, what it frees may be
    enough for the job to be reopened for writing (as it should be); then writes are made to
    fail again. Bounded: each round takes what was freed."""
    for _ in range(20):
        settle(volume)
        fill(filler, leave)
        settle(volume)
        if free_bytes(volume) >= leave + wal_limit(0):
            continue  # something freed space after the fill: take it too
        if readyz(server) == 503:
            return
        refused(writer.until_refused())  # reopened for writing meanwhile: run it out again
    raise AssertionError("the volume never stayed full")


def start(tmp_path: Path, volume: Path, reserve: int, port: int | None = None, probe: str = "/readyz"):
    env = {
        "STATEHOUSE_BACKEND": "rocksdb",
        "STATEHOUSE_DATA_DIR": str(volume / "data"),
        "STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "STATEHOUSE_DISK_RESERVE_BYTES": str(reserve),
    }
    return start_server(tmp_path / "server", env, port=port, probe=probe)


def port_of(server: ServerProcess) -> int:
    return int(server.url.rsplit(":", 1)[1])


class Writer:
    """Writes batches of incompressible values; remembers what was acknowledged."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self.acked: dict[str, str] = {}
        self.n = 0

    def batch(self, keys: int = 10, value_bytes: int = 20_000) -> httpx.Response:
        values = {f"k{self.n + i}": os.urandom(value_bytes // 2).hex() for i in range(keys)}
        self.n += keys
        ops = [{"op": "put", "state": "v", "key": k, "value": v} for k, v in values.items()]
        r = self.http.post(f"{JOB}/batch", json={"ops": ops})
        assert r.status_code != 500, r.text
        if r.status_code == 200:
            self.acked.update(values)
        return r

    def until_refused(self) -> httpx.Response:
        for _ in range(10_000):
            r = self.batch()
            if r.status_code != 200:
                return r
        raise AssertionError("the volume never filled up")

    def check_all(self) -> None:
        keys = list(self.acked)
        for start in range(0, len(keys), 200):
            chunk = keys[start : start + 200]
            got = self.http.post(f"{JOB}/batch", json={"ops": [{"op": "get", "state": "v", "key": k} for k in chunk]})
            assert got.status_code == 200, got.text
            assert [r["value"] for r in got.json()["results"]] == [self.acked[k] for k in chunk]


def readyz(server: ServerProcess) -> int:
    return httpx.get(server.url + "/readyz", timeout=10).status_code


def wait_readyz(server: ServerProcess, status: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while readyz(server) != status:
        assert time.monotonic() < deadline, f"/readyz did not turn {status} within {WAIT_S} s"
        time.sleep(0.2)


def refused(r: httpx.Response) -> None:
    assert r.status_code == 507, r.text
    assert r.json()["code"] == "insufficient_storage"
    assert r.headers["content-type"] == "application/problem+json"


def make_job(http: httpx.Client) -> None:
    http.put(JOB, json={"max_parallelism": 128}).raise_for_status()
    http.put(f"{JOB}/states/v", json={"kind": "value"}).raise_for_status()


@pytest.mark.parametrize("reserve", [RESERVE, 0], ids=["refused-at-the-reserve", "rocksdb-runs-out"])
def test_a_full_volume_refuses_writes_reports_not_ready_and_recovers_without_restart(tmp_path, volume, reserve):
    """With a reserve the service refuses writes before RocksDB runs out; without one (0) RocksDB
    fails a write, and the job is reopened for writing once space returns: both end the same."""
    filler = volume / "filler"
    fill(filler, leave=24 << 20)
    server = start(tmp_path, volume, reserve)
    try:
        http = httpx.Client(base_url=server.url, timeout=30)
        make_job(http)
        writer = Writer(http)
        refused(writer.until_refused())
        assert len(writer.acked) > 100  # it wrote megabytes before refusing
        assert "statehouse_data_volume_free_bytes" in httpx.get(server.url + "/metrics").text
        keep_full(server, writer, filler, volume, leave=min(reserve, 1 << 20))
        answer = httpx.get(server.url + "/readyz", timeout=10)  # one answer: its status and why
        assert answer.status_code == 503 and "space" in answer.json()["detail"], answer.text
        refused(writer.batch(keys=1, value_bytes=10))  # small ones too
        refused(http.put(f"{JOB}/states/w", json={"kind": "value"}))
        writer.check_all()  # reads go on
        assert httpx.get(server.url + "/healthz").status_code == 200
        # Space comes back: ready again and writable, by itself.
        filler.unlink()
        wait_readyz(server, 200)
        for _ in range(5):
            assert writer.batch().status_code == 200
        writer.check_all()
        assert "Traceback" not in server.log()
    finally:
        server.stop()


TTL_MS = 1500


def test_reads_of_expired_entries_answer_below_the_reserve_and_clean_up_once_space_returns(tmp_path, volume):
    """Flink's cleanup on read writes a deletion in the read's transaction; below the reserve
    that write is refused, and the read used to answer 507. Now a transaction whose only changes
    are TTL cleanups is dropped there: the one-key, batch and columnar reads answer as TTL says
    (absent, or the value not cleaned up yet), a real write is still 507, and the entries are
    cleaned by the reads once space is back."""
    filler = volume / "filler"
    server = start(tmp_path, volume, RESERVE)
    try:
        http = httpx.Client(base_url=server.url, timeout=30)
        http.put(JOB, json={"max_parallelism": 128}).raise_for_status()
        ttl = {"ttl_ms": TTL_MS}
        states = {
            "t": {"kind": "value", "value_type": "int64", "ttl": ttl},  # incremental cleanup on too
            "l": {"kind": "list", "ttl": ttl},
            "m": {"kind": "map", "ttl": ttl},
            # Returns what is not cleaned up yet: whether a read cleaned shows in its answer.
            "r": {
                "kind": "value",
                "ttl": {**ttl, "visibility": "return_expired_if_not_cleaned_up", "cleanup_incremental_size": 0},
            },
            "v": {"kind": "value"},
            # A read that renews the time to live writes: dropping it would shorten the TTL.
            "renewed": {"kind": "value", "ttl": {"ttl_ms": 3_600_000, "update_type": "on_read_and_write"}},
        }
        for name, body in states.items():
            http.put(f"{JOB}/states/{name}", json=body).raise_for_status()
        keys = [f"k{i}" for i in range(20)]
        written = time.monotonic()
        ops = [{"op": "put", "state": "t", "key": k, "value": i} for i, k in enumerate(keys)]
        ops += [{"op": "add", "state": "l", "key": k, "value": 1} for k in keys]
        ops += [{"op": "map_put", "state": "m", "key": k, "user_key": "u", "value": 1} for k in keys]
        ops += [{"op": "put", "state": "r", "key": k, "value": "old"} for k in keys]
        ops.append({"op": "put", "state": "renewed", "key": "k0", "value": 1})
        http.post(f"{JOB}/batch", json={"ops": ops}).raise_for_status()

        fill(filler, leave=1 << 20)
        time.sleep(max(0.0, written + TTL_MS / 1000 + 0.2 - time.monotonic()))  # until they expired
        assert readyz(server) == 503  # below the reserve
        assert http.get(f"{JOB}/states/t/keys/k0").status_code == 404
        assert http.get(f"{JOB}/states/l/keys/k0").status_code == 404
        assert http.get(f"{JOB}/states/m/keys/k0/entries/u").status_code == 404
        got = http.post(f"{JOB}/batch", json={"ops": [{"op": "get", "state": "t", "key": k} for k in keys]})
        assert got.status_code == 200, got.text
        assert [r["value"] for r in got.json()["results"]] == [None] * len(keys)
        columnar = http.post(f"{JOB}/states/t/columns/get", content=arrow(key=keys), headers={"content-type": ARROW})
        assert values(columnar) == [None] * len(keys)
        for _ in range(2):  # not cleaned up: the cleanup was dropped, each time
            assert http.get(f"{JOB}/states/r/keys/k0").json() == {"value": "old"}
        assert len(http.get(f"{JOB}/states/t/keys", params={"limit": 100}).json()["items"]) == len(keys)
        refused(http.put(f"{JOB}/states/v/keys/k0", json={"value": 1}))  # a real write still is
        refused(http.get(f"{JOB}/states/renewed/keys/k0"))
        refused(http.post(f"{JOB}/batch", json={"ops": [ops[0], {"op": "get", "state": "t", "key": "k1"}]}))

        filler.unlink()
        wait_readyz(server, 200)
        assert http.get(f"{JOB}/states/r/keys/k0").json() == {"value": "old"}  # returned once, and cleaned
        assert http.get(f"{JOB}/states/r/keys/k0").status_code == 404
        got = http.post(f"{JOB}/batch", json={"ops": [{"op": "get", "state": "t", "key": k} for k in keys]})
        assert got.status_code == 200, got.text
        assert http.get(f"{JOB}/states/t/keys", params={"limit": 100}).json()["items"] == []
        assert "Traceback" not in server.log()
    finally:
        server.stop()


def test_a_restart_with_little_space_serves_reads_then_recovers(tmp_path, volume):
    """Killed with a write-ahead log to replay, restarted with less room than replaying needs:
    the job opens read-only (reads served, writes 507, not ready), and reopens for writing once
    space is freed; partial table files of the failed opens are removed."""
    filler = volume / "filler"
    server = start(tmp_path, volume, RESERVE)
    try:
        http = httpx.Client(base_url=server.url, timeout=30)
        make_job(http)
        writer = Writer(http)
        for _ in range(15):  # ~3 MB: more than one write-ahead log's worth (a quarter of the reserve)
            assert writer.batch().status_code == 200
        server.stop(signal.SIGKILL)  # nothing flushed: the log is replayed at the next open
        job_dir = volume / "data" / "j"
        stray = job_dir / "999999.sst"  # as a failed open leaves a table file its MANIFEST never got
        stray.write_bytes(os.urandom(64 << 10))  # removing it leaves too little room all the same
        # Less room than one batch's replay (~200 KB, incompressible): a log switch under load can
        # leave as little as the last batch in the log to replay.
        fill(filler, leave=64 << 10)
        server = start(tmp_path, volume, RESERVE, port=port_of(server), probe="/healthz")
        http = httpx.Client(base_url=server.url, timeout=30)
        writer.http = http
        writer.check_all()
        assert readyz(server) == 503
        refused(writer.batch())
        assert "opened read-only" in server.log()
        assert not stray.exists()  # RocksDB itself removes strays only after an open succeeds
        filler.unlink()
        wait_readyz(server, 200)
        assert writer.batch().status_code == 200
        writer.check_all()
        assert "Traceback" not in server.log()
    finally:
        server.stop()


def test_heap_backend_checkpoints_and_restores_on_a_full_volume(tmp_path, volume):
    """The heap backend writes files only to checkpoint (a local checkpoint directory) and to
    restore (the staging copy in the data directory): on a full volume a checkpoint fails (its
    status says so), a restore is refused with 507 and the job stays as it was, writes go on
    (they need no disk), and both work again once space is freed."""
    filler = volume / "filler"
    env = {
        "STATEHOUSE_BACKEND": "heap",
        "STATEHOUSE_DATA_DIR": str(volume / "data"),
        "STATEHOUSE_CHECKPOINT_DIR": str(volume / "checkpoints"),
    }
    server = start_server(tmp_path / "server", env)
    try:
        http = httpx.Client(base_url=server.url, timeout=30)
        make_job(http)
        writer = Writer(http)
        for _ in range(20):  # ~4 MB
            assert writer.batch().status_code == 200
        assert http.post(f"{JOB}/checkpoints", json={"checkpoint_id": 1}).status_code == 202
        assert wait_status(http, f"{JOB}", 1)["status"] == "uploaded"
        http.post(f"{JOB}/checkpoints/1/complete").raise_for_status()
        fill(filler, leave=0)
        at_checkpoint_1 = dict(writer.acked)
        assert writer.batch().status_code == 200  # what checkpoint 2's delta holds: ~200 KB
        assert http.post(f"{JOB}/checkpoints", json={"checkpoint_id": 2}).status_code == 202
        failed = wait_status(http, f"{JOB}", 2)
        assert failed["status"] == "failed" and "No space left" in failed["error"], failed
        restore = http.post(f"{JOB}/restore", json={"checkpoint_id": 1})
        assert restore.status_code in (200, 507), restore.text  # 200: it fitted in memory
        if restore.status_code == 507:
            refused(restore)
        else:
            writer.acked = at_checkpoint_1
        assert writer.batch().status_code == 200
        writer.check_all()
        assert readyz(server) == 200  # the heap backend's writes need no disk
        filler.unlink()
        assert http.post(f"{JOB}/checkpoints", json={"checkpoint_id": 3}).status_code == 202
        assert wait_status(http, f"{JOB}", 3)["status"] == "uploaded"
        http.post(f"{JOB}/checkpoints/3/complete").raise_for_status()
        http.post(f"{JOB}/restore", json={"checkpoint_id": 3}).raise_for_status()
        writer.check_all()
        assert "Traceback" not in server.log()
    finally:
        server.stop()
