"""``statehouse serve --replicas N``: a local replica set for development and tests. Replica i listens
on port PORT+i, keeps its data in DIR/data-<i> and logs to DIR/replica-<i>.log; all share the
checkpoint storage DIR/checkpoints (or $STATEHOUSE_CHECKPOINT_DIR), as a set's replicas share S3,
and each advertises the set's URLs (STATEHOUSE_REPLICA_URLS), so that one URL is enough for a client.
Ctrl-C or SIGTERM stops them all. It needs the server installed (pip install statehouse-server).

DIR/statehouse-serve.json describes the running set; ``statehouse rescale`` uses it to grow the set
live (new empty replicas started with the new count, once the target is checked, before the move)
and, once no move is pending, to fit it to the layout that serves (the replicas a committed shrink
retired, or an aborted grow left unassigned, stopped, their data moved aside to
data-<i>.removed-v<version>-<time>, the version being the one that serves), or, with ``--offline``,
to restart the set with another replica count."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import urllib3

from statehouse.client.cli.common import CommandError, emit, note, output_option
from statehouse.protocol import routes

STATE_FILE = "statehouse-serve.json"
_TOPOLOGY_SETTINGS = (
    "STATEHOUSE_REPLICA_INDEX",
    "STATEHOUSE_REPLICA_COUNT",
    "STATEHOUSE_ADOPT_TOPOLOGY",
    "STATEHOUSE_TOPOLOGY_VERSION",
    "STATEHOUSE_REPLICA_URLS",
)


HELP = "run a local multi-replica set until Ctrl-C"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=1, metavar="N", help="replica count (default 1)")
    parser.add_argument("--port", type=int, default=8000, help="replica 0's port; replica i listens on PORT+i")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--dir", default=".", help="where data-<i>/, checkpoints/ and the logs go (default .)")
    parser.add_argument("--start-timeout", type=float, default=60.0, help="seconds for a replica to be ready")
    output_option(parser)


def state_path(directory: str | Path) -> Path:
    return Path(directory).resolve() / STATE_FILE


def read_state(directory: str | Path) -> dict[str, Any] | None:
    try:
        return json.loads(state_path(directory).read_text())
    except (OSError, ValueError):
        return None


class ReplicaSet:
    """The replica processes of one ``serve``, started and stopped together."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.directory = Path(args.dir).resolve()
        self.processes: list[subprocess.Popen[bytes]] = []
        self.count = 0

    def urls(self, count: int) -> list[str]:
        host = "127.0.0.1" if self.args.host in ("0.0.0.0", "") else self.args.host
        return [f"http://{host}:{self.args.port + i}" for i in range(count)]

    def start(self, count: int, *, adopt: bool = False, version: int | None = None) -> list[str]:
        """Start ``count`` replicas and wait until each is ready; their URLs. ``adopt``: at the
        topology ``version`` (STATEHOUSE_TOPOLOGY_VERSION), which the new, empty replicas record too."""
        urls = self.urls(count)
        self.count = count
        for i in range(count):
            self._spawn(i, count, urls, adopt=adopt, version=version)
        for i, url in enumerate(urls):
            self._wait_ready(i, url)
        return urls

    def grow(self, count: int, version: int) -> list[str]:
        """Start the replicas ``count`` adds, empty, as replicas of ``count`` at topology ``version``
        (a live rescale then moves their key groups in); wait until each answers. Every URL."""
        urls = self.urls(count)
        first = len(self.processes)
        for i in range(first, count):
            self._spawn(i, count, urls, adopt=False, version=version)
        for i in range(first, count):
            self._wait_ready(i, urls[i], probe=routes.HEALTHZ)  # not ready until the move commits
        self.count = count
        return urls

    def shrink(self, count: int, version: int | None) -> list[str]:
        """Stop the replicas from ``count`` on (a live rescale retired them, or aborted adding
        them) and move their data aside, named after ``version``, the topology version that serves;
        the remaining URLs."""
        for process in self.processes[count:]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for index, process in list(enumerate(self.processes))[count:]:
            try:
                process.wait(timeout=35)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            _set_aside(self.directory, index, version)
        self.processes = self.processes[:count]
        self.count = count
        return self.urls(count)

    def _spawn(self, i: int, count: int, urls: list[str], *, adopt: bool, version: int | None) -> None:
        checkpoints = os.environ.get("STATEHOUSE_CHECKPOINT_DIR") or str(self.directory / "checkpoints")
        base = {k: v for k, v in os.environ.items() if k not in _TOPOLOGY_SETTINGS}
        env = {
            **base,
            "STATEHOUSE_REPLICA_INDEX": str(i),
            "STATEHOUSE_REPLICA_COUNT": str(count),
            "STATEHOUSE_DATA_DIR": str(self.directory / f"data-{i}"),
            "STATEHOUSE_CHECKPOINT_DIR": checkpoints,
            "STATEHOUSE_REPLICA_URLS": ",".join(urls),
            **({"STATEHOUSE_ADOPT_TOPOLOGY": "1"} if adopt else {}),
            **({"STATEHOUSE_TOPOLOGY_VERSION": str(version)} if version else {}),
        }
        command = [sys.executable, "-m", "statehouse.app.serve", "--host", self.args.host]
        with open(self.directory / f"replica-{i}.log", "ab") as log:
            self.processes.append(
                subprocess.Popen(
                    [*command, "--port", str(self.args.port + i)], env=env, stdout=log, stderr=subprocess.STDOUT
                )
            )

    def _wait_ready(self, index: int, url: str, probe: str = routes.READYZ) -> None:
        deadline = time.monotonic() + self.args.start_timeout
        http = urllib3.PoolManager(timeout=urllib3.Timeout(total=2), retries=False)
        while True:
            if self.processes[index].poll() is not None:
                raise CommandError(f"replica {index} exited at start: {self.last_line(index)}")
            try:
                if http.request("GET", f"{url}{probe}").status == 200:
                    return
            except urllib3.exceptions.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise CommandError(
                    f"replica {index} ({url}) not ready after {self.args.start_timeout:.0f}s: see its log"
                )
            time.sleep(0.1)

    def last_line(self, index: int) -> str:
        log = self.directory / f"replica-{index}.log"
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        refusal = [line for line in lines if line.startswith("statehouse:")]
        return (refusal or lines or ["(no output)"])[-1] + f" ({log})"

    def exited(self) -> int | None:
        """The index of a replica that stopped on its own, if one did."""
        return next((i for i, p in enumerate(self.processes) if p.poll() is not None), None)

    def stop(self) -> None:
        """SIGTERM to every replica (each drains), then wait; SIGKILL past the grace period."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=35)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("statehouse.app") is None:
        raise CommandError(
            "serve runs the Statehouse server, which is not installed here: pip install statehouse-server"
        )
    if args.replicas < 1:
        raise CommandError("--replicas must be at least 1", 2)
    directory = Path(args.dir).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    stopping: list[int] = []
    rescale: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGHUP, lambda *_: rescale.append(True))
    replicas = ReplicaSet(args)
    try:
        urls = replicas.start(args.replicas)
        _announce(args, replicas, urls, first=True)
        while not stopping:
            time.sleep(0.2)
            if rescale:
                rescale.clear()
                urls = _requested(args, replicas)
            crashed = replicas.exited()
            if crashed is not None:
                raise CommandError(f"replica {crashed} stopped: {replicas.last_line(crashed)}")
    except KeyboardInterrupt:
        pass
    finally:
        note(args, "stopping the replicas ...")
        replicas.stop()
        state_path(directory).unlink(missing_ok=True)
    return 0


def _requested(args: argparse.Namespace, replicas: ReplicaSet) -> list[str]:
    """What ``statehouse rescale`` asked for (SIGHUP, with the request in the state file): ``grow``
    or ``shrink`` the set live, or (offline) restart it with another replica count."""
    state = read_state(args.dir) or {}
    count = int(state.get("requested_replicas") or replicas.count)
    version = state.get("requested_version")
    action = state.get("request", "restart")
    if action in ("grow", "shrink"):
        _write_state(args, replicas, [], status="changing")
        if action == "grow":
            note(args, f"starting replicas {replicas.count}..{count - 1} (empty, topology version {version}) ...")
            before = replicas.count
            try:
                urls = replicas.grow(count, int(version or 0))
            except CommandError as exc:
                # Back to the set as it was, so that the rescale that asked starts no move.
                note(args, f"{exc}: stopping replicas {before}..{count - 1} again")
                urls = replicas.shrink(before, state.get("committed_version"))
                failed = f"could not start replicas {before}..{count - 1} ({exc}); the set is as it was"
                _announce(args, replicas, urls, first=False, failed=failed)
                return urls
        else:
            note(args, f"stopping replicas {count}..{replicas.count - 1} (not in the layout that serves) ...")
            urls = replicas.shrink(count, version)
        _announce(args, replicas, urls, first=False)
        return urls
    return _restart(args, replicas, count, version)


def _set_aside(directory: Path, index: int, version: Any) -> None:
    """A removed replica's data must never rejoin a later layout as if current: moved aside, kept."""
    data = directory / f"data-{index}"
    if data.exists():
        serving = f"v{version}-" if version is not None else ""
        data.rename(directory / f"data-{index}.removed-{serving}{int(time.time())}")


def _restart(args: argparse.Namespace, replicas: ReplicaSet, count: int, version: Any) -> list[str]:
    """The set again with the replica count ``statehouse rescale --offline`` asked for, adopting the
    new layout (its jobs answer layout_mismatch until rescale restores them)."""
    note(args, f"restarting the set with {count} replicas (adopting topology version {version}) ...")
    _write_state(args, replicas, [], status="restarting")
    previous = replicas.count
    replicas.stop()
    for index in range(count, previous):
        _set_aside(replicas.directory, index, version)
    urls = replicas.start(count, adopt=True, version=version)
    _announce(args, replicas, urls, first=False)
    return urls


def _announce(
    args: argparse.Namespace, replicas: ReplicaSet, urls: list[str], *, first: bool, failed: str | None = None
) -> None:
    """The set is ready with ``urls``; ``failed``: the request that could not be done (the set as
    it was before it), for the rescale that asked."""
    document = _write_state(args, replicas, urls, status="ready", failed=failed)
    if first or args.json:
        lines = [f"{len(urls)} replicas ready (Ctrl-C stops them); STATEHOUSE_URLS={','.join(urls)}"]
        lines += [f"  replica {i}: {url}  data {replicas.directory / f'data-{i}'}" for i, url in enumerate(urls)]
        emit(args, document, lines)
        sys.stdout.flush()
    else:
        note(args, f"{len(urls)} replicas ready: STATEHOUSE_URLS={','.join(urls)}")


def _write_state(
    args: argparse.Namespace, replicas: ReplicaSet, urls: list[str], *, status: str, failed: str | None = None
) -> dict[str, Any]:
    document: dict[str, Any] = {
        "pid": os.getpid(),
        "status": status,
        "replicas": len(urls) if urls else replicas.count,
        "urls": urls,
        "directory": str(replicas.directory),
        "start_timeout": args.start_timeout,
        "logs": [str(replicas.directory / f"replica-{i}.log") for i in range(len(urls))],
        **({"failed": failed} if failed else {}),
    }
    path = state_path(args.dir)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(document, indent=1))
    os.replace(temporary, path)
    return document
