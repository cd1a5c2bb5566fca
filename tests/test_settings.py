"""A bad STATEHOUSE_* variable stops the server with one line naming it, and exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from harness.server import REPO, free_port, start_server, stop_process
from statehouse.app.settings import load_settings

START_TIMEOUT = 60  # seconds for uvicorn to import the app and give up

BAD = {
    "bad literal": (
        {"STATEHOUSE_BACKEND": "Heap"},
        ["STATEHOUSE_BACKEND='Heap' is not one of: rocksdb, heap"],
    ),
    "not an integer": (
        {"STATEHOUSE_REPLICA_COUNT": "zero"},
        ["STATEHOUSE_REPLICA_COUNT='zero' is not an integer"],
    ),
    "below the minimum": (
        {"STATEHOUSE_NUM_RETAINED": "0"},
        ["STATEHOUSE_NUM_RETAINED='0' must be >= 1"],
    ),
    "index >= count": (
        {"STATEHOUSE_REPLICA_INDEX": "2", "STATEHOUSE_REPLICA_COUNT": "2"},
        ["STATEHOUSE_REPLICA_INDEX='2' must be < STATEHOUSE_REPLICA_COUNT (2)"],
    ),
    "several at once": (
        {
            "STATEHOUSE_BACKEND": "memory",
            "STATEHOUSE_REPLICA_INDEX": "-1",
            "STATEHOUSE_SNAPSHOT_COMPRESSION": "gzip",
            "STATEHOUSE_INCREMENTAL_CHECKPOINTS": "maybe",
            "STATEHOUSE_MAX_BODY_BYTES": "64MB",
        },
        [
            "STATEHOUSE_BACKEND='memory' is not one of: rocksdb, heap",
            "STATEHOUSE_REPLICA_INDEX='-1' must be >= 0",
            "STATEHOUSE_SNAPSHOT_COMPRESSION='gzip' is not one of: zstd, none",
            "STATEHOUSE_INCREMENTAL_CHECKPOINTS='maybe' is not a boolean (true/false, 1/0, yes/no, on/off)",
            "STATEHOUSE_MAX_BODY_BYTES='64MB' is not an integer",
        ],
    ),
}


def clean_environment(tmp_path, env: dict[str, str]) -> dict[str, str]:
    """This process's environment without inherited STATEHOUSE_* settings, plus ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("STATEHOUSE_")}
    return {
        **base,
        "STATEHOUSE_DATA_DIR": str(tmp_path / "data"),
        "STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        **env,
    }


@pytest.mark.parametrize("env, expected", BAD.values(), ids=BAD.keys())
def test_uvicorn_exits_2_naming_the_variable(tmp_path, env, expected):
    command = [sys.executable, "-m", "uvicorn", "statehouse.app.main:app", "--host", "127.0.0.1"]
    process = subprocess.Popen(
        [*command, "--port", str(free_port())],
        cwd=REPO,
        env=clean_environment(tmp_path, env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        stop_process(process)
        pytest.fail(f"uvicorn did not exit within {START_TIMEOUT}s with {env}")
    assert "Traceback" not in stderr, stderr
    assert stderr.splitlines() == [f"statehouse: {line}" for line in expected]
    assert stdout == ""
    assert process.returncode == 2


def test_load_settings_in_process(monkeypatch, capsys):
    for name in [k for k in os.environ if k.upper().startswith("STATEHOUSE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("STATEHOUSE_MAX_PAGE_SIZE", "lots")
    with pytest.raises(SystemExit) as exit_info:
        load_settings()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "statehouse: STATEHOUSE_MAX_PAGE_SIZE='lots' is not an integer\n"
    monkeypatch.setenv("STATEHOUSE_MAX_PAGE_SIZE", "50")
    assert load_settings().max_page_size == 50


def test_good_environment_starts(tmp_path):
    server = start_server(
        tmp_path,
        {"STATEHOUSE_BACKEND": "heap", "STATEHOUSE_REPLICA_INDEX": "1", "STATEHOUSE_REPLICA_COUNT": "2"},
    )
    try:
        ready = httpx.get(server.url + "/readyz", timeout=10).json()
        assert (ready["backend"], ready["replica_index"], ready["replica_count"]) == ("heap", 1, 2)
    finally:
        server.stop()
