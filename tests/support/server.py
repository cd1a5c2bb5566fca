"""Start a real Statehouse server (uvicorn in a process of its own) for tests and benchmarks."""

from __future__ import annotations

import atexit
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

REPO = Path(__file__).resolve().parents[2]


class Process(Protocol):
    """What tests use of a server's process: ``subprocess.Popen``'s, or a :class:`ForkedProcess`'s."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class ForkedProcess:
    """A server forked by the zygote (tests/support/zygote.py), with ``subprocess.Popen``'s
    methods: not this process's child, so its exit code is the one the zygote writes when it
    reaps it."""

    def __init__(self, pid: int, status: Path, args: list[str]) -> None:
        self.pid, self.returncode, self._status, self.args = pid, None, status, args

    def poll(self) -> int | None:
        if self.returncode is None and self._status.exists():
            self.returncode = int(self._status.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # its pid is not reused before the zygote has reaped it
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """This test process's zygote (tests/support/zygote.py), started on the first fork asked for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        atexit.register(self.close)

    def fork(self, command: ModuleCommand) -> ForkedProcess:
        log = command.log
        status = log.with_name(f".{log.name}.{uuid.uuid4().hex}.exit")
        request = {"module": command.module, "argv": command.argv, "env": command.env, "cwd": str(command.cwd)}
        request.update({"log": str(log), "stderr": str(command.stderr) if command.stderr else None})
        request.update({"append": command.append, "status": str(status)})
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "tests.support.zygote"],
                    cwd=REPO,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
            assert self._process.stdin is not None and self._process.stdout is not None
            self._process.stdin.write(json.dumps(request).encode() + b"\n")
            self._process.stdin.flush()
            answer = self._process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the server zygote exited with {self._process.wait()}")
        return ForkedProcess(json.loads(answer)["pid"], status, command.args)

    def close(self) -> None:
        if self._process is not None and self._process.stdin is not None:
            self._process.stdin.close()
            self._process.wait(10)


# Set by the test suite (tests/conftest.py): servers are forked from a zygote. Benchmarks start
# each server as ``python -m statehouse.app.serve``, as deployments do.
FORK_SERVERS = False
_zygote = Zygote()


def stop_process(process: Process, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
    """Signal a child and wait for it; SIGKILL it if it has not exited within ``timeout``."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    return process.returncode


# Under pytest-xdist each worker draws ports from a range of its own, below the ephemeral ports
# (32768 on) and SeaweedFS's (tests/support/s3server.py: 20000 on): a port is picked, then bound
# by the server it is for, and a port the kernel hands out can be taken in between by another
# worker's server, whose answers the test would read as its own.
_WORKER_PORTS = 1_000
_next_port = itertools.count()


def free_port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not (worker.startswith("gw") and worker[2:].isdigit()):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    base = 10_000 + int(worker[2:]) * _WORKER_PORTS
    for _ in range(_WORKER_PORTS):
        port = base + next(_next_port) % _WORKER_PORTS
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {base}-{base + _WORKER_PORTS - 1}")


@dataclass
class ServerProcess:
    url: str
    process: Process
    log_path: Path
    settings: dict[str, str]  # the STATEHOUSE_* environment it runs with

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        return stop_process(self.process, sig, timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(
    workdir: Path,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    port: int | None = None,
    probe: str = "/readyz",
) -> ServerProcess:
    """Run the server (``python -m statehouse.app.serve``: uvicorn with the HTTP limits) with
    ``STATEHOUSE_*`` settings from ``env``, on ``port`` (a free one by default; pass a stopped
    server's port to restart it in place); returns once ``probe`` answers 200 (``/healthz`` for a
    server expected to start not ready).

    ``timeout`` is a ceiling for a process that is still starting: on a loaded machine (a whole
    suite on 2 cores, three replicas at once) a start took over 20 s; a process that exits
    fails at once, with its log."""
    return await_ready(launch_server(workdir, env, port), timeout, probe)


def start_servers(
    specs: list[tuple[Path, dict[str, str]]], timeout: float = 120, probe: str = "/readyz"
) -> list[ServerProcess]:
    """:func:`start_server` for each ``(workdir, env)``, all launched before any is awaited: a
    start is mostly CPU (imports, the app's routes, opening the state), so on 2 cores two
    replicas are up in about the time of one. If one fails, all are killed."""
    servers: list[ServerProcess] = []
    try:
        for workdir, env in specs:
            servers.append(launch_server(workdir, env))
        return [await_ready(server, timeout, probe) for server in servers]
    except BaseException:
        for server in servers:
            server.stop(signal.SIGKILL)
        raise


@dataclass(frozen=True)
class ModuleCommand:
    """``python -m module *argv`` with ``env`` in ``cwd``: its output in ``log`` (appended to with
    ``append``), its stderr in ``stderr`` when given."""

    module: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    cwd: Path = REPO
    stderr: Path | None = None
    append: bool = False

    @property
    def args(self) -> list[str]:
        """The command line it runs as a new interpreter (a forked one runs the same)."""
        return [sys.executable, "-m", self.module, *self.argv]


def run_module(command: ModuleCommand) -> Process:
    """Run ``command``: forked from the zygote in the test suite, where the imports are done once; a
    new interpreter elsewhere."""
    if FORK_SERVERS:
        return _zygote.fork(command)
    mode = "ab" if command.append else "wb"
    with open(command.log, mode) as out, open(command.stderr or os.devnull, mode) as err:
        return subprocess.Popen(
            command.args,
            cwd=command.cwd,
            env=command.env,
            stdout=out,
            stderr=err if command.stderr else subprocess.STDOUT,
        )


def refused_start(workdir: Path, env: dict[str, str], timeout: float = 60) -> tuple[int, str, str]:
    """``python -m uvicorn statehouse.app.main:app``, as an operator starts it, with only ``env``'s
    ``STATEHOUSE_*`` settings (the data and checkpoint directories in ``workdir`` unless ``env`` names
    them), for a start expected to fail: its exit code, stdout and stderr once it has exited. One still
    running after ``timeout`` seconds is stopped and fails the test."""
    workdir.mkdir(parents=True, exist_ok=True)
    inherited = {k: v for k, v in os.environ.items() if not k.upper().startswith("STATEHOUSE_")}
    full_env = {
        **inherited,
        "STATEHOUSE_DATA_DIR": str(workdir / "data"),
        "STATEHOUSE_CHECKPOINT_DIR": str(workdir / "checkpoints"),
        **env,
    }
    out, err = workdir / "uvicorn.out", workdir / "uvicorn.err"
    argv = ["statehouse.app.main:app", "--host", "127.0.0.1", "--port", str(free_port())]
    process = run_module(ModuleCommand("uvicorn", argv, full_env, out, stderr=err))
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        stop_process(process)
        raise AssertionError(f"uvicorn did not exit within {timeout}s with {env}") from None
    return code, out.read_text(), err.read_text()


def launch_server(workdir: Path, env: dict[str, str] | None = None, port: int | None = None) -> ServerProcess:
    """The server process of :func:`start_server`, started and not awaited."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    full_env = {
        **os.environ,
        "STATEHOUSE_DATA_DIR": str(workdir / "data"),
        "STATEHOUSE_CHECKPOINT_DIR": str(workdir / "checkpoints"),
        **(env or {}),
    }
    log_path = workdir / f"server-{port}.log"
    argv = ["--host", "127.0.0.1", "--port", str(port)]
    process = run_module(ModuleCommand("statehouse.app.serve", argv, full_env, log_path))
    settings = {k: v for k, v in full_env.items() if k.startswith("STATEHOUSE_")}
    return ServerProcess(f"http://127.0.0.1:{port}", process, log_path, settings)


def await_ready(server: ServerProcess, timeout: float = 120, probe: str = "/readyz") -> ServerProcess:
    """Poll ``probe`` until it answers 200 (see :func:`start_server`); kill the server if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + probe, timeout=5).status_code == 200:
                return server
        except httpx.TransportError:  # not listening yet, or too busy to answer in time
            pass
        time.sleep(0.05)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server did not become ready in {timeout}s:\n{server.log()}")


def start_replica_set(workdirs: list[Path], env: dict[str, str]) -> list[ServerProcess]:
    """The replicas of one deployment of ``len(workdirs)``, started together (:func:`start_servers`):
    replica ``i`` on ``workdirs[i]``, with ``env`` and its index and count."""
    count = str(len(workdirs))
    return start_servers(
        [
            (workdir, {**env, "STATEHOUSE_REPLICA_INDEX": str(i), "STATEHOUSE_REPLICA_COUNT": count})
            for i, workdir in enumerate(workdirs)
        ]
    )


def start_two_replicas(tmp_path_factory) -> list[ServerProcess]:
    """Replicas 0 and 1 of a two-replica RocksDB deployment sharing one checkpoint storage."""
    shared = str(tmp_path_factory.mktemp("replica-checkpoints"))  # one storage, as S3 would be
    workdirs = [tmp_path_factory.mktemp(f"replica-{i}") for i in range(2)]
    return start_replica_set(workdirs, {"STATEHOUSE_CHECKPOINT_DIR": shared})
