"""The package index's ``statehouse`` is another project, with a regular ``statehouse/__init__.py``.

Installed beside the client wheel it lands in the same ``site-packages/statehouse/`` and hides
the ``statehouse.*`` namespace (every import fails inside its ``__init__``). In a real venv holding
both, the ``statehouse`` command says so in one line, with what to do; once that is done, the
client works again (no file of ours was overwritten).
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

# The wheels fixture builds in the source tree: on the one xdist worker that runs every such build.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("in-tree-build")]

OTHER = "statehouse==0.1.1"  # "Strongly consistent state and memory engine for AI agents"
# --no-compile: a venv used once needs no .pyc.
INSTALL = ["install", "--quiet", "--no-compile", "--disable-pip-version-check"]


def run(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_the_command_names_the_conflicting_package_in_one_line(tmp_path: Path, wheels: dict[str, Path]) -> None:
    env_dir = tmp_path / "both"
    venv.create(env_dir, with_pip=False)  # this venv's pip installs into it (--python)
    python, statehouse = str(env_dir / "bin/python"), str(env_dir / "bin/statehouse")
    pip = [sys.executable, "-m", "pip", "--python", python]
    installed = run([*pip, *INSTALL, str(wheels["statehouse_client"])])
    assert installed.returncode == 0, installed.stderr[-3000:]
    other = run([*pip, *INSTALL, OTHER])  # with its dependencies, as a user installs it
    assert other.returncode == 0, other.stderr[-3000:]
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    assert (site / "statehouse/__init__.py").is_file() and (site / "statehouse/client/__init__.py").is_file()

    expected = (
        f"statehouse: {site / 'statehouse/__init__.py'} belongs to another project (statehouse 0.1.1) and hides "
        "statehouse-client's statehouse.* modules; remove it: pip uninstall statehouse\n"
    )
    # A library import (the other project's __init__ imports our client first) ends with the same line.
    broken = run([python, "-c", "import statehouse.client"])
    assert broken.returncode == 1, broken.stderr
    assert broken.stderr.splitlines()[-1] == "ImportError: " + expected.removeprefix("statehouse: ").rstrip("\n")
    for command in (["status", "--urls", "http://127.0.0.1:9"], ["serve"], ["--help"]):
        shown = run([statehouse, *command], 60)
        assert (shown.returncode, shown.stdout, shown.stderr) == (2, "", expected), command

    removed = run([*pip, "uninstall", "--yes", "--quiet", "statehouse"])
    assert removed.returncode == 0, removed.stderr[-3000:]
    assert not (site / "statehouse/__init__.py").exists()
    works = run([statehouse, "--help"], 60)
    assert works.returncode == 0 and works.stdout.startswith("usage: statehouse"), works.stderr
    imported = run([python, "-c", "import statehouse.client, statehouse.protocol.keygroups; print('ok')"], 60)
    assert imported.stdout == "ok\n", imported.stderr
    alone = run([statehouse, "serve"], 60)  # the client alone: serve names the server's distribution
    assert alone.stderr.endswith("pip install statehouse-server\n"), alone.stderr

    # A statehouse/__init__.py that no distribution installed (here on PYTHONPATH) is named too.
    stray = tmp_path / "stray"
    (stray / "statehouse").mkdir(parents=True)
    (stray / "statehouse/__init__.py").write_text("")
    shown = subprocess.run(
        [statehouse, "status"], capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(stray)}
    )
    assert (shown.returncode, shown.stdout) == (2, ""), shown.stderr
    assert shown.stderr == (
        f"statehouse: {stray / 'statehouse/__init__.py'} is no part of statehouse-client or statehouse-server "
        "(no installed distribution records it) and hides their statehouse.* modules; "
        "move its statehouse/ out of the path\n"
    )
