"""A bad STATEHOUSE_* variable stops the server with one line naming it, and exit status 2."""

from __future__ import annotations

import os
import re
import subprocess

import httpx
import pytest
from pydantic import ValidationError

from statehouse.app.settings import (
    NOT_SERVER_SETTINGS,
    Settings,
    describe_errors,
    load_settings,
    setting_variables,
    unknown_variables,
)
from tests.support.server import REPO, refused_start, start_server

pytestmark = [pytest.mark.http]

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
            "STATEHOUSE_ROCKSDB_COMPRESSION": "LZ4",
        },
        [
            "STATEHOUSE_BACKEND='memory' is not one of: rocksdb, heap",
            "STATEHOUSE_REPLICA_INDEX='-1' must be >= 0",
            "STATEHOUSE_SNAPSHOT_COMPRESSION='gzip' is not one of: zstd, none",
            "STATEHOUSE_INCREMENTAL_CHECKPOINTS='maybe' is not a boolean (true/false, 1/0, yes/no, on/off)",
            "STATEHOUSE_MAX_BODY_BYTES='64MB' is not an integer",
            "STATEHOUSE_ROCKSDB_COMPRESSION='LZ4' is not one of: lz4, zstd, snappy, none",
        ],
    ),
    "a malformed token entry (the token is not printed)": (
        {"STATEHOUSE_API_TOKENS": "s3cret-1:orders, s3cret-2:orders payments"},
        [
            "STATEHOUSE_API_TOKENS: entry 2 has an invalid scope 'orders payments': use job names, '*' (every job) "
            "or '@admin'"
        ],
    ),
    "an unreadable tokens file": (
        {"STATEHOUSE_API_TOKENS_FILE": "/nonexistent/tokens"},
        ["STATEHOUSE_API_TOKENS_FILE='/nonexistent/tokens' cannot be read: No such file or directory"],
    ),
    "a restore location above its bucket": (
        {"STATEHOUSE_RESTORE_LOCATIONS": "/archive, s3://bucket/../other"},
        [
            "STATEHOUSE_RESTORE_LOCATIONS='/archive, s3://bucket/../other': location 's3://bucket/../other' climbs "
            "above its bucket"
        ],
    ),
    "a delta weight of nothing": (
        {"STATEHOUSE_HEAP_CHANGELOG_DELTA_WEIGHT": "0"},
        ["STATEHOUSE_HEAP_CHANGELOG_DELTA_WEIGHT='0' must be > 0.0"],
    ),
    "a misspelled variable": (
        {"STATEHOUSE_BAKEND": "heap"},
        ["STATEHOUSE_BAKEND='heap' is not a setting: did you mean STATEHOUSE_BACKEND?"],
    ),
    "an unknown variable, and a bad value": (
        {"STATEHOUSE_COLOUR": "blue", "STATEHOUSE_MAX_JOBS": "many"},
        [
            "STATEHOUSE_COLOUR='blue' is not a setting: see docs/operations.md for the settings",
            "STATEHOUSE_MAX_JOBS='many' is not an integer",
        ],
    ),
}


@pytest.mark.parametrize("env, expected", BAD.values(), ids=BAD.keys())
def test_uvicorn_exits_2_naming_the_variable(tmp_path, env, expected):
    code, stdout, stderr = refused_start(tmp_path, env, START_TIMEOUT)
    assert "Traceback" not in stderr, stderr
    assert stderr.splitlines() == [f"statehouse: {line}" for line in expected]
    assert stdout == ""
    assert code == 2


# What the lifespan opens (checkpoint storage, the data directory) fails after uvicorn has logged its
# first INFO lines; the failure itself is still one line and exit status 2, never a traceback.
START_ERRORS = {
    "an unsupported checkpoint location": (
        {"STATEHOUSE_CHECKPOINT_DIR": "ftp://x"},
        "STATEHOUSE_CHECKPOINT_DIR='ftp://x': unsupported checkpoint location 'ftp://x': use a path, file://, "
        "s3:// or memory://",
    ),
    "a data directory that is a file": (
        {"STATEHOUSE_DATA_DIR": "{tmp}/a-file"},
        "STATEHOUSE_DATA_DIR='{tmp}/a-file': File exists: {tmp}/a-file",
    ),
}


@pytest.mark.parametrize("env, expected", START_ERRORS.values(), ids=START_ERRORS.keys())
def test_start_errors_are_one_line_and_exit_2(tmp_path, env, expected):
    (tmp_path / "a-file").write_text("")
    env = {name: value.format(tmp=tmp_path) for name, value in env.items()}
    code, _stdout, stderr = refused_start(tmp_path, env, START_TIMEOUT)
    assert code == 2, stderr
    assert "Traceback" not in stderr, stderr
    problems = [line for line in stderr.splitlines() if not line.startswith("INFO:")]
    assert problems == [f"statehouse: {expected.format(tmp=tmp_path)}"]


def test_every_statehouse_variable_in_the_repository_is_known():
    """Names the Makefile, tests and tools read must be in the allow-list, or the server (started
    by the tests with their environment) would refuse them."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    not_variables = {
        "STATEHOUSE_PATHS",  # bench/spark_columnar.py: a Python constant
        "STATEHOUSE_BAKEND",  # the misspelling docs/operations.md shows refused
    }
    names = set()
    for name in files:
        path = REPO / name
        if (
            name != "tests/operations/test_settings.py"
            and path.suffix in {".py", ".md", ".yaml", ".tpl", ".toml", ""}
            and path.is_file()
        ):
            names.update(re.findall(r"STATEHOUSE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    known = set(setting_variables()) | NOT_SERVER_SETTINGS
    assert names - not_variables - known == set()
    assert NOT_SERVER_SETTINGS - names == set(), "an allow-listed name nothing reads any more"


def test_non_server_variables_are_accepted(monkeypatch):
    for name in [k for k in os.environ if k.upper().startswith("STATEHOUSE_")]:
        monkeypatch.delenv(name)
    environ = {name: "1" for name in NOT_SERVER_SETTINGS} | {"STATEHOUSE_BACKEND": "heap", "OTHER": "x"}
    assert unknown_variables(environ) == []
    assert unknown_variables({"STATEHOUSE_MAX_BATCH_OP": "5"}) == [
        "STATEHOUSE_MAX_BATCH_OP='5' is not a setting: did you mean STATEHOUSE_MAX_BATCH_OPS?"
    ]


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


def token_settings(monkeypatch, tmp_path, tokens: str | None = None, file: str | None = None):
    for name in [k for k in os.environ if k.upper().startswith("STATEHOUSE_")]:
        monkeypatch.delenv(name)
    if tokens is not None:
        monkeypatch.setenv("STATEHOUSE_API_TOKENS", tokens)
    if file is not None:
        (tmp_path / "tokens").write_text(file)
        monkeypatch.setenv("STATEHOUSE_API_TOKENS_FILE", str(tmp_path / "tokens"))
    return Settings()


def test_token_scopes(monkeypatch, tmp_path):
    # plain tokens, as before scopes: every job, not admin
    plain = token_settings(monkeypatch, tmp_path, " tok-1 , tok-2,, ")
    assert plain.tokens == {"tok-1", "tok-2"}
    assert all(g.all_jobs and not g.admin and g.allows("any") for g in plain.grants.values())
    assert token_settings(monkeypatch, tmp_path, "").grants == {}  # auth off

    scoped = token_settings(
        monkeypatch,
        tmp_path,
        "a1:orders+clicks, a2:*, a3:@admin, a4:admin, YWJj+/=:orders",
        file="# comment\n\nf1:payments\nf2:x, f3:y\n",
    )
    grants = scoped.grants
    assert grants["a1"].jobs == {"orders", "clicks"} and not grants["a1"].allows("payments")
    assert grants["a2"].all_jobs and not grants["a2"].admin
    assert grants["a3"].admin and grants["a3"].allows("anything")
    assert grants["a4"].jobs == {"admin"} and not grants["a4"].admin  # a job called admin, not the admin scope
    assert grants["YWJj+/="].jobs == {"orders"}  # base64 tokens keep their + / =
    assert {t: g.jobs for t, g in grants.items() if t.startswith("f")} == {"f1": {"payments"}, "f2": {"x"}, "f3": {"y"}}


@pytest.mark.parametrize(
    ("tokens", "file", "message"),
    [
        ("secret:", None, "STATEHOUSE_API_TOKENS: entry 1 has an empty scope (scopes are separated by '+')"),
        ("secret:a++b", None, "STATEHOUSE_API_TOKENS: entry 1 has an empty scope (scopes are separated by '+')"),
        ("ok, secret:a:b", None, "STATEHOUSE_API_TOKENS: entry 2 has an invalid scope 'a:b'"),
        ("ok, :a", None, "STATEHOUSE_API_TOKENS: entry 2 has no token before ':'"),
        ("secr\u00e9t", None, "STATEHOUSE_API_TOKENS: entry 1 has a token that is not visible ASCII"),
        ("secret:..", None, "STATEHOUSE_API_TOKENS: entry 1 has an invalid scope '..'"),
        (
            "secret:a",
            "other\nsecret:b\n",
            "STATEHOUSE_API_TOKENS_FILE='{file}': line 2, entry 1 repeats the token of STATEHOUSE_API_TOKENS entry 1",
        ),
        (None, "# only a comment\n", "STATEHOUSE_API_TOKENS_FILE='{file}' holds no token: auth would be off"),
    ],
)
def test_bad_tokens_stop_startup_without_printing_them(monkeypatch, capsys, tmp_path, tokens, file, message):
    with pytest.raises(ValidationError) as info:
        token_settings(monkeypatch, tmp_path, tokens, file)
    (line,) = describe_errors(info.value)
    assert line.startswith(message.format(file=tmp_path / "tokens")), line
    assert "secret" not in line and "secr" not in line


def test_the_s3_clients_timeouts_and_attempts_are_settings(monkeypatch, capsys):
    """``STATEHOUSE_S3_CONNECT_TIMEOUT_S``, ``STATEHOUSE_S3_READ_TIMEOUT_S`` and ``STATEHOUSE_S3_MAX_ATTEMPTS``
    reach botocore's client (the housekeeping client keeps one attempt: its abort loop paces itself); a
    value out of bounds is one line at start."""
    pytest.importorskip("boto3")
    from statehouse.snapshots.storage import open_storage

    for name in [k for k in os.environ if k.upper().startswith("STATEHOUSE_")]:
        monkeypatch.delenv(name)
    default = open_storage("s3://bucket/prefix", s3_timeouts=load_settings().s3_timeouts)
    config = default._client.meta.config
    assert (config.connect_timeout, config.read_timeout, config.retries["total_max_attempts"]) == (5.0, 30.0, 4)
    monkeypatch.setenv("STATEHOUSE_S3_CONNECT_TIMEOUT_S", "1.5")
    monkeypatch.setenv("STATEHOUSE_S3_READ_TIMEOUT_S", "4")
    monkeypatch.setenv("STATEHOUSE_S3_MAX_ATTEMPTS", "6")
    storage = open_storage("s3://bucket/prefix", s3_timeouts=load_settings().s3_timeouts)
    config = storage._client.meta.config
    assert (config.connect_timeout, config.read_timeout, config.retries["total_max_attempts"]) == (1.5, 4.0, 6)
    housekeeping = storage._housekeeping.meta.config
    assert (housekeeping.read_timeout, housekeeping.retries["total_max_attempts"]) == (4.0, 1)
    monkeypatch.setenv("STATEHOUSE_S3_MAX_ATTEMPTS", "0")
    with pytest.raises(SystemExit) as exit_info:
        load_settings()
    assert exit_info.value.code == 2
    assert "STATEHOUSE_S3_MAX_ATTEMPTS" in capsys.readouterr().err
