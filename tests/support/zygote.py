"""A server zygote: one process per test worker that has imported the server's code once and forks a
replica for each start the tests ask for.

A replica started as ``python -m statehouse.app.serve`` spends ~1 s of its ~1.5 s of start CPU importing
(FastAPI, pydantic, pyarrow and its pandas shim, the app's modules); the suite starts some three hundred.
A forked child starts from the imported modules and runs exactly what ``python -m statehouse.app.serve``
runs from there on: :func:`statehouse.app.serve.main` with the request's arguments, environment, working
directory and log file, building the app from its own ``STATEHOUSE_*`` settings (``statehouse.app.main``
is imported in the child, never here), and exiting as an interpreter does (``atexit``, thread joins).

The protocol, over the zygote's stdin and stdout, one JSON object per line: a request
``{"module", "argv", "env", "cwd", "log", "stderr", "append", "status"}`` is answered ``{"pid"}`` once
forked; when that child exits, its exit code (``subprocess``'s convention: ``-N`` for signal N) is written
to the ``status`` file. The child runs ``python -m MODULE ARGV`` from there on: ``statehouse.app.serve``'s
``main``, or another module (``uvicorn``, as the settings tests start it) through :mod:`runpy`. Its
output goes to ``log`` (appended to with ``append``), its stderr to ``stderr`` when given. The zygote exits
when its stdin closes (its test worker is gone); children outlive it, as subprocesses outlive the worker
that started them.

Nothing here may start a thread: a fork copies only the forking thread.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import sys
from pathlib import Path

MAIN = Path(__file__).resolve().parents[2] / "app" / "main.py"
SERVE = "statehouse.app.serve"


def preimport() -> None:
    """Every module ``statehouse.app.main`` imports (read from its source), and what its start loads
    lazily, without importing ``statehouse.app.main`` itself: that builds the app from the environment."""
    names = {"statehouse.app.serve", "boto3", "botocore.config", "uvicorn.lifespan.on", "uvicorn.loops.uvloop"}
    for node in ast.walk(ast.parse(MAIN.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    for name in sorted(names):
        with contextlib.suppress(ImportError):  # a name imported from a module, not a module
            importlib.import_module(name)
    import pyarrow as pa

    pa.array([0]).take([0])  # pyarrow's pandas shim, as the app's lifespan loads it


def _reap(statuses: dict[int, str]) -> None:
    while statuses:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        path = statuses.pop(pid, None)
        if path is not None:
            Path(path + ".part").write_text(str(os.waitstatus_to_exitcode(status)))
            os.replace(path + ".part", path)


def serve_forever() -> dict | None:
    """The zygote's loop; returns the request in a forked child, ``None`` in the zygote at the end."""
    statuses: dict[int, str] = {}
    buffer = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.02)
        _reap(statuses)
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return None
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return request
            statuses[pid] = request["status"]
            os.write(1, json.dumps({"pid": pid}).encode() + b"\n")


def become(request: dict) -> None:
    """In the child: the request's working directory, environment, log and signals, as a new process."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    mode = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if request["append"] else os.O_TRUNC)
    log = os.open(request["log"], mode, 0o644)
    errors = os.open(request["stderr"], mode, 0o644) if request["stderr"] else log
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(errors, 2)
    for fd in {null, log, errors}:
        os.close(fd)
    # As a fresh interpreter has them.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    sys.argv = [request["module"], *request["argv"]]


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker's Ctrl-C is the worker's to handle
    preimport()
    request = serve_forever()
    if request is None:
        return
    become(request)
    if request["module"] != SERVE:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        return
    from statehouse.app import serve

    serve.main(request["argv"])


if __name__ == "__main__":
    main()
