"""The checkpoint walkthrough in docs/checkpoints.md, run as written against a real server, twice in a
row: a user pastes it again, and every step must hold on a job that the first paste left behind (no
fixed checkpoint id, no loop waiting for a status the checkpoint has gone past)."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.server import REPO, start_server

pytestmark = [pytest.mark.http]

# The walkthrough's loop asks for the status at most 100 times, 0.2 s apart (plus the requests):
# one paste ends well within this, or a step hangs.
PASTE_TIMEOUT = 90


def walkthrough() -> str:
    text = (REPO / "docs/checkpoints.md").read_text()
    section = text[text.index("## A walkthrough") :]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    assert found is not None, "docs/checkpoints.md has no walkthrough block"
    return found.group(1)


def paste(script: str) -> list[str]:
    """Run the block as a shell that stops at the first failing command would; its output lines."""
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=PASTE_TIMEOUT
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


def answers(lines: list[str]) -> list[dict]:
    return [json.loads(line) for line in lines if line.startswith("{")]


def check_paste(lines: list[str], checkpoint: int) -> None:
    """One paste's output: checkpoint ``checkpoint`` triggered, uploaded, completed and restored, the
    savepoint right after it, the figures of the walkthrough's comments."""
    shown = answers(lines)
    assert not [a for a in shown if "code" in a], "a step answered an error"
    assert {"checkpoint_id": checkpoint, "status": "in_progress"} in shown
    assert f"checkpoint {checkpoint}: uploaded" in lines
    completed = next(a for a in shown if a.get("status") == "completed" and "bytes_uploaded" in a)
    assert completed["checkpoint_id"] == checkpoint and completed["location"].endswith(f"/ledger/chk-{checkpoint}")
    listing = next(a for a in shown if "ids" in a)
    assert listing["ids"][-1] == [checkpoint, "checkpoint", "completed"]
    assert listing["next_checkpoint_id"] == checkpoint + 1
    assert lines.count('{"value":15}') == 1 and lines.count('{"value":10}') == 1
    assert lines.index('{"value":15}') < lines.index('{"value":10}')
    restored = next(a for a in shown if "entries_restored" in a)
    assert (restored["checkpoint_id"], restored["aborted_checkpoints"]) == (checkpoint, [])
    savepoint = shown[-1]
    assert (savepoint["checkpoint_id"], savepoint["kind"], savepoint["status"]) == (
        checkpoint + 1,
        "savepoint",
        "completed",
    )
    assert savepoint["location"].endswith(f"/ledger/savepoints/sp-{checkpoint + 1}"), savepoint


# CI installs jq (.ci/run), so there a missing jq fails the test instead of skipping it.
@pytest.mark.skipif(shutil.which("jq") is None and not os.environ.get("CI"), reason="jq is not installed")
def test_checkpoint_walkthrough_runs_twice_as_written(tmp_path: Path) -> None:
    server = start_server(tmp_path, {"STATEHOUSE_BACKEND": "rocksdb"})
    try:
        script = walkthrough().replace("localhost:8000", server.url.removeprefix("http://"))
        first = paste(script)
        second = paste(script)
    finally:
        server.stop()
    check_paste(first, checkpoint=1)
    # Ids only grow: the second paste takes the next ones (3, savepoint 4), restores its own
    # checkpoint and ends with the same figures.
    check_paste(second, checkpoint=3)
    listing = next(a for a in answers(second) if "ids" in a)
    assert [2, "savepoint", "completed"] in listing["ids"]  # the first paste's savepoint is kept
