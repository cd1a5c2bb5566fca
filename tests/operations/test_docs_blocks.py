"""Every shell and Python block of README.md and docs/*.md, run as written against real servers.

Blocks run in the order of the page, pages in the order README.md, docs/*.md (by name), each block
in its own process: shell blocks under ``bash -euo pipefail`` (a ``curl --fail-with-body`` that
fails fails the test), Python blocks with this venv's interpreter; the working directory is a
scratch directory holding a ``.venv`` link to this venv. One server is the documented
``localhost:8000`` / ``127.0.0.1:8000`` / ``$REPLICA_URL``; two replicas of one deployment are the
documented ``http://sh-0:8000`` / ``http://statehouse-0:8000`` and ``-1``. Those addresses are
replaced in the text run; nothing else is. Where a block shows output as a comment that starts
with ``{`` or ``[`` (``curl ... # {"value":12.5}``, or on its own line below a command), that text
must appear in the block's output, in that order.

A block that cannot run here is marked in the markdown, on the line (or the last line) before it:

    <!-- docs-test: skip (why) -->     skipped, with the reason shown (pytest -rs)
    <!-- docs-test: spark (where) -->  run by the Spark tests (tests/operations/test_first_hour.py)

Any other block must run: a shell or Python block without a marker is run, and a fenced block in a
language this test does not know fails it, so that no command escapes silently. Indented code
blocks (README's ``make run``) count as shell blocks.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.docs_blocks import Block, check_output, parse_page
from tests.support.server import REPO, free_port, start_server, start_two_replicas

pytestmark = [pytest.mark.http]

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TIMEOUT = 60  # seconds for one block: a hung command fails instead of stalling the suite


BLOCKS = [block for path in PAGES for block in parse_page(path)]


def test_markers_are_known_and_give_a_reason():
    for block in BLOCKS:
        if block.marker is not None:
            assert block.marker in ("skip", "spark"), f"{block.id}: unknown marker {block.marker!r}"
            assert block.reason, f"{block.id}: a {block.marker} marker says why"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The documented addresses: one server, and two replicas of one deployment."""
    single = start_server(tmp_path_factory.mktemp("docs-server"), {"STATEHOUSE_BACKEND": "rocksdb"})
    replicas = start_two_replicas(tmp_path_factory)
    addresses = {"localhost:8000": single.url, "127.0.0.1:8000": single.url}
    for i, replica in enumerate(replicas):
        addresses |= {f"http://sh-{i}:8000": replica.url, f"http://statehouse-{i}:8000": replica.url}
    yield addresses
    for server in (single, *replicas):
        server.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("docs-workdir")
    (path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    return path


def with_addresses(code: str, addresses: dict[str, str]) -> str:
    for documented, real in addresses.items():
        if "://" in documented:
            code = code.replace(documented, real)
        else:  # with and without the scheme
            code = code.replace(f"http://{documented}", real).replace(documented, real.removeprefix("http://"))
    return code


def run(block: Block, addresses: dict[str, str], workdir: Path) -> subprocess.CompletedProcess:
    code = with_addresses(block.code, addresses)
    venv_bin = str(Path(sys.executable).parent)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("STATEHOUSE_")},
        "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}",
        "REPLICA_URL": addresses["localhost:8000"],
    }
    command = ["bash", "-euo", "pipefail", "-c", code] if block.language == "bash" else [sys.executable, "-c", code]
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_block_runs_as_written(block: Block, servers, workdir):
    if block.marker == "skip":
        pytest.skip(f"{block.id}: {block.reason}")
    if block.marker == "spark":
        pytest.skip(f"{block.id}: run by the Spark tests ({block.reason})")
    # CI installs jq (.ci/run), so there a missing jq fails the block instead of skipping it.
    if re.search(r"\bjq\b", block.code) and shutil.which("jq") is None and not os.environ.get("CI"):
        pytest.skip(f"{block.id}: jq is not installed")
    result = run(block, servers, workdir)
    assert result.returncode == 0, f"{block.id} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    check_output(block, result.stdout)


def test_the_runner_catches_what_used_to_escape(servers, workdir, tmp_path):
    """A failing curl, output other than the one shown, an unmarked block in an unknown language."""
    page = tmp_path / "page.md"
    page.write_text(
        "```sh\ncurl -sS --fail-with-body localhost:8000/v1/jobs/no-such-job; echo after\n```\n\n"
        '```sh\ncurl -sS localhost:8000/healthz   # {"status":"down"}\n```\n'
    )
    failing, wrong_output = parse_page(page)
    result = run(failing, servers, workdir)
    assert result.returncode == 22 and "job_not_found" in result.stdout and "after" not in result.stdout
    result = run(wrong_output, servers, workdir)
    assert result.returncode == 0
    with pytest.raises(AssertionError, match="not in the output"):
        check_output(wrong_output, result.stdout)
    page.write_text("```console\n$ curl localhost:8000/healthz\n```\n")
    with pytest.raises(AssertionError, match="a ```console block"):
        parse_page(page)


def test_readme_make_run_serves_the_api(tmp_path):
    """README's first command as written, `make run` (skipped above: it runs in the foreground),
    started here on a free port through the STATEHOUSE_PORT the Makefile reads, until /readyz."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATEHOUSE_")} | {
        "STATEHOUSE_PORT": str(port),
        "STATEHOUSE_DATA_DIR": str(tmp_path / "data"),
        "STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
    }
    log = tmp_path / "make-run.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            ["make", "--no-print-directory", "run"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # make and the server it starts: one group to stop
        )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):  # bounded: at most ~60 s
            assert process.poll() is None, f"make run exited {process.returncode}:\n{log.read_text()}"
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError(f"make run did not answer /readyz:\n{log.read_text()}")
        assert httpx.put(f"{url}/v1/jobs/shop", json={"max_parallelism": 128}).status_code == 201
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
