"""The checkpoint walkthrough in docs/checkpoints.md, run as written against a real server."""

import os
import re
import shutil
import subprocess

import pytest

from tests.support.server import REPO, start_server

pytestmark = [pytest.mark.http]


def walkthrough() -> str:
    text = (REPO / "docs/checkpoints.md").read_text()
    section = text[text.index("## A walkthrough") :]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


# CI installs jq (.ci/run), so there a missing jq fails the test instead of skipping it.
@pytest.mark.skipif(shutil.which("jq") is None and not os.environ.get("CI"), reason="jq is not installed")
def test_checkpoint_walkthrough_runs_as_written(tmp_path):
    server = start_server(tmp_path, {"STATEHOUSE_BACKEND": "rocksdb"})
    try:
        script = walkthrough().replace("localhost:8000", server.url.removeprefix("http://"))
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert '{"checkpoint_id":1,"status":"in_progress"}' in lines
    assert any(line.startswith('{"checkpoint_id":1,"status":"completed"') for line in lines)
    assert '{"ids":[[1,"completed"]],"next_checkpoint_id":2}' in lines
    assert lines.count('{"value":15}') == 1 and lines.count('{"value":10}') == 1
    assert '{"checkpoint_id":1,"entries_restored":1,"aborted_checkpoints":[]}' in lines
    assert lines[-1].endswith("/ledger/savepoints/sp-2"), lines[-1]
