"""The two distributions: both wheels build, map into the one ``statehouse`` namespace, and the
client wheel installs alone (no FastAPI, RocksDB or boto3) and passes the client tests.

This is what a Spark executor's image does: ``pip install statehouse_client-*.whl``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import httpx
import pytest

from statehouse.client import StatehouseClient
from statehouse.client.coordinator import CheckpointCoordinator
from tests.support.layers import CLIENT_FOLDERS, SERVER_FOLDERS, sources
from tests.support.server import REPO

# setuptools builds in the source tree (build/, *.egg-info): one xdist worker runs every such build
# (test_first_hour's wheel too), so that two never share those directories.
pytestmark = [pytest.mark.http, pytest.mark.slow, pytest.mark.xdist_group("in-tree-build")]

SERVER_ONLY = ("fastapi", "uvicorn", "rocksdict", "boto3", "pydantic", "starlette")


def run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, (
        f"{cmd} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result


def wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if ".dist-info/" not in n}


def test_both_wheels_map_into_one_namespace(wheels):
    client, server = wheel_files(wheels["statehouse_client"]), wheel_files(wheels["statehouse_server"])
    # Beside the namespace only the command's entry point, which checks the namespace first.
    client -= {"statehouse_guard.py"}
    assert all(n.startswith("statehouse/") for n in client | server)
    assert "statehouse/__init__.py" not in client | server  # a PEP 420 namespace both install into
    assert not client & server  # no file owned by both distributions
    top = lambda files: {n.split("/")[1] for n in files}  # noqa: E731
    assert top(client) == set(CLIENT_FOLDERS)
    assert top(server) == set(SERVER_FOLDERS)
    # Every package folder of the repository is in its wheel (the package lists are explicit).
    for folder in CLIENT_FOLDERS + SERVER_FOLDERS:
        for init in (p for p in sources(folder) if p.name == "__init__.py"):
            member = "statehouse/" + str(init.relative_to(REPO))
            assert member in client | server, f"{member} is in no wheel: add it to a pyproject's packages"


def test_server_wheel_depends_on_the_client_at_the_same_version(wheels):
    client = tomllib.loads((REPO / "client/packaging/pyproject.toml").read_text())["project"]
    server = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"statehouse-client=={client['version']}" in server["dependencies"]
    assert client["version"] == server["version"]
    for dependency in client["dependencies"]:
        assert not dependency.split("=")[0].lower().startswith(SERVER_ONLY)


def test_client_wheel_installs_alone_and_passes_the_client_tests(wheels, tmp_path, two_replicas):
    env_dir = tmp_path / "executor-venv"
    # Without pip of its own: this venv's pip installs into it (--python), 3 s less than ensurepip.
    venv.create(env_dir, with_pip=False)
    python = str(env_dir / "bin" / "python")
    # --no-compile: the executor venv is used once, botocore's thousands of modules need no .pyc.
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-compile"]
    pip.append("--disable-pip-version-check")
    # What the client tests need besides the client: pytest, and httpx to probe the replicas.
    test_pins = [
        d
        for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
        if d.startswith(("pytest==", "httpx=="))
    ]
    assert len(test_pins) == 2, test_pins
    run([*pip, str(wheels["statehouse_client"]), *test_pins], 600)

    probe = run(
        [
            python,
            "-c",
            "import importlib.util as u, statehouse.client as c;"
            f"print(c.__file__); print(*[m for m in {SERVER_ONLY!r} if u.find_spec(m)])",
        ],
        60,
        cwd=tmp_path,
    ).stdout.splitlines()
    assert probe[0].startswith(str(env_dir)), probe  # the installed wheel, not the checkout
    assert probe[1:] == [""], f"server-only packages in the client venv: {probe[1:]}"
    wheel_kib = wheels["statehouse_client"].stat().st_size // 1024
    site = sum(f.stat().st_size for f in (env_dir / "lib").rglob("*") if f.is_file()) // (1 << 20)
    print(f"client wheel {wheel_kib} KiB; executor venv with its dependencies, pytest and httpx {site} MiB")

    # The wheel puts the operator's command on PATH; `serve` says in one line that it needs the server.
    statehouse = str(env_dir / "bin" / "statehouse")
    shown = run([statehouse, "status", "--urls", ",".join(s.url for s in two_replicas[::-1])], 60, cwd=tmp_path)
    assert "2 replicas, topology version 1" in shown.stdout, shown.stdout
    serve = subprocess.run([statehouse, "serve"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (serve.returncode, serve.stderr) == (
        1,
        "statehouse serve: serve runs the Statehouse server, which is not installed here: "
        "pip install statehouse-server\n",
    )

    env = {**os.environ, "STATEHOUSE_TEST_REPLICAS": ",".join(s.url for s in two_replicas)}
    result = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--confcutdir", "tests/client", "tests/client"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout

    # With its checkpoint extra, the client reads a checkpoint's parts with the server's own format
    # code (snapshots/, in this wheel) and no server package: what option("checkpoint") does on an
    # executor (its operator-state path here, without Spark).
    wheel = wheels["statehouse_client"]
    run([*pip, f"{wheel}[checkpoint]"], 600)
    job = "packaged"
    with httpx.Client(timeout=30) as http:
        for i, server in enumerate(two_replicas):
            http.put(f"{server.url}/v1/jobs/{job}", json={"max_parallelism": 32}).raise_for_status()
            path = f"{server.url}/v1/jobs/{job}/operators/source/subtasks/{i}/lists/offsets"
            http.put(path, json={"value": [i, {"at": i * 10}]}).raise_for_status()
    with StatehouseClient([s.url for s in two_replicas]) as client:
        parts = CheckpointCoordinator(client.job(job)).checkpoint(1).parts
    storage = parts[0]["location"].removesuffix(f"/{job}/chk-1")
    script = (
        "import json, sys\n"
        "from statehouse.snapshots.catalog import latest_complete, read_parts\n"
        "from statehouse.snapshots.operator_format import OperatorStateData, list_elements\n"
        "from statehouse.snapshots.storage import open_storage\n"
        "storage = open_storage(sys.argv[1])\n"
        "found = {}\n"
        "for part in read_parts(storage, latest_complete(storage, sys.argv[2])):\n"
        "    data = OperatorStateData.from_bytes(storage.read_verified(part.metadata.operator.under(part.directory)))\n"
        "    found.update({sub: list_elements(raw) for (_op, _name, sub), raw in data.lists.items()})\n"
        "print(json.dumps(sorted(found.items())))\n"
    )
    read = run([python, "-c", script, storage, job], 60, cwd=tmp_path).stdout
    assert json.loads(read) == [[0, [0, {"at": 0}]], [1, [1, {"at": 10}]]]
