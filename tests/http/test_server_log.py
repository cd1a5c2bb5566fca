"""The server's own log (``STATEHOUSE_LOG_LEVEL``): the events an operator needs reach stderr,
each line naming its module; a limit's refusal of one request is a debug line, not an info one."""

import logging

import httpx

from statehouse.backends.limits import Limits
from statehouse.backends.rocksdb.space import DataVolume
from tests.support.checkpoint_status import wait_status
from tests.support.server import start_server


def test_the_log_shows_instances_opened_and_closed_and_a_restore_swap(tmp_path):
    server = start_server(tmp_path, {"STATEHOUSE_BACKEND": "rocksdb"})
    try:
        http = httpx.Client(base_url=server.url + "/v1", timeout=10)
        http.put("/jobs/j", json={"max_parallelism": 128}).raise_for_status()
        http.put("/jobs/j/states/total", json={"kind": "reducing", "function": "sum"}).raise_for_status()
        http.put("/jobs/j/states/seen", json={"kind": "map"}).raise_for_status()
        ops = [
            {"op": "add", "state": "total", "key": "a", "value": 1},
            {"op": "map_put", "state": "seen", "key": "a", "user_key": "1", "value": True},
        ]
        http.post("/jobs/j/batch", json={"ops": ops}).raise_for_status()
        http.post("/jobs/j/checkpoints", json={"checkpoint_id": 1}).raise_for_status()
        assert wait_status(http, "/jobs/j", 1)["status"] != "failed"
        http.post("/jobs/j/checkpoints/1/complete").raise_for_status()
        http.post("/jobs/j/restore", json={"checkpoint_id": 1}).raise_for_status()
        refused = http.post("/jobs/j/batch", json={"ops": [{"op": "get", "state": "total", "key": "k" * 5000}]})
        assert refused.json()["code"] == "key_too_large"
    finally:
        server.stop()
    log = server.log()
    data = tmp_path / "data" / "j"
    assert "statehouse: statehouse replica 0/1" in log  # app/main.py's startup line, invisible before
    assert f"statehouse.backends.rocksdb.partition: opened RocksDB instance {data} in " in log
    assert "statehouse.backends.catalog: restore swapped in job j from checkpoint 1 at " in log
    assert "key groups 0-127 of max parallelism 128, replacing the live job, writer epoch 1" in log
    assert f"reopened RocksDB instance {data} in " in log  # the live instance, over the restored files
    assert f"closed RocksDB instance {data}\n" in log  # at shutdown
    assert "refused by a limit" not in log  # debug: one request's answer, not a server event


def test_a_limit_refusal_is_logged_at_debug_naming_the_limit(caplog):
    with caplog.at_level(logging.DEBUG, logger="statehouse.backends.limits"):
        error = Limits(max_key_bytes=10).key_error(11)
    assert [(r.name, r.levelno) for r in caplog.records] == [("statehouse.backends.limits", logging.DEBUG)]
    assert caplog.records[0].getMessage() == f"refused by a limit (key_too_large): {error.detail}"


def test_the_data_volume_logs_each_reserve_crossing_once(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="statehouse.backends.rocksdb.space"):
        volume = DataVolume(str(tmp_path), reserve_bytes=1 << 62)  # more than any disk has free
        volume.above_reserve()  # still below: no second line
        volume.reserve_bytes = 0
        volume.above_reserve()
        volume.above_reserve()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO]
    assert "below the reserve" in lines[0][1] and "writes are refused" in lines[0][1]
    assert "above the reserve again: writes resume" in lines[1][1]
