"""Fixtures of the operations tests: the wheels (built in the source tree), S3 that a test stops."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.s3server import SeaweedS3
from tests.support.server import REPO


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both distributions' wheels, built once: ``statehouse_client`` and ``statehouse_server``.

    setuptools builds in the source tree (build/, *.egg-info), so only tests of the ``in-tree-build``
    xdist group use this: one worker runs them all, and two builds never share those directories."""
    out = tmp_path_factory.mktemp("wheels")
    for source in (REPO / "client/packaging", REPO):
        # A stale build/lib would put modules deleted since into the wheel.
        shutil.rmtree(source / "build", ignore_errors=True)
        # --no-isolation: the venv's setuptools builds them (no download); the tree stays clean.
        build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)]
        result = subprocess.run(build, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{build} exited {result.returncode}:\n{result.stderr[-3000:]}"
    built = {p.name.split("-")[0]: p for p in out.glob("*.whl")}
    # Not `statehouse`: that name on the package index is another project.
    assert set(built) == {"statehouse_server", "statehouse_client"}, built
    return built


@pytest.fixture
def s3(s3_server: SeaweedS3) -> Iterator[SeaweedS3]:
    """The session's SeaweedFS, which the test stops; running again afterwards, whatever happened."""
    try:
        yield s3_server
    finally:
        if s3_server._process is None:
            s3_server.start()
