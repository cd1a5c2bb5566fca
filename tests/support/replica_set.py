"""A replica set that changes size while it serves, for the live-rescale tests and benchmark.

Replicas (RocksDB unless told) over one checkpoint storage (S3 or a directory): started at topology version 1,
grown by a new empty replica at the next version (as docs/rescale.md has the operator start
it), SIGKILLed and restarted in place (same port, same data directory, same settings), and asked
what each one stores, key by key (``GET .../scan`` over every key group, not only the owned ones),
so that a test can say every key lives only on its owner.
"""

from __future__ import annotations

import contextlib
import signal
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa

from statehouse.protocol.keygroups import operator_index
from statehouse.protocol.routes import NEXT_CURSOR
from tests.support.server import ServerProcess, start_server, start_servers


@dataclass
class ReplicaSet:
    """``servers[i]`` is replica ``i``; ``storage`` is the STATEHOUSE_* (and AWS_*) environment of
    the shared checkpoint storage, given to every replica."""

    root: Path
    storage: dict[str, str]
    servers: list[ServerProcess] = field(default_factory=list)
    extra: dict[str, str] = field(default_factory=dict)  # more settings for every replica
    backend: str = "rocksdb"  # heap: a restart loses the replica's state (and its record of a move)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self, count: int) -> list[str]:
        """Replicas 0..count-1 of a fresh set, at topology version 1 (started together)."""
        self.servers += start_servers([self._spec(index, count, None) for index in range(count)], probe="/healthz")
        return self.urls

    def add(self, index: int, count: int, version: int) -> ServerProcess:
        """A new, empty replica ``index`` of ``count`` at topology ``version`` (the target of a rescale);
        it serves nothing until the move loads it, so only its liveness is awaited."""
        server = self._start(index, count, version)
        if index < len(self.servers):
            self.servers[index] = server
        else:
            assert index == len(self.servers), f"add replica {len(self.servers)} first"
            self.servers.append(server)
        return server

    def _start(self, index: int, count: int, version: int | None) -> ServerProcess:
        return start_server(*self._spec(index, count, version), probe="/healthz")

    def _spec(self, index: int, count: int, version: int | None) -> tuple[Path, dict[str, str]]:
        env = {
            "STATEHOUSE_BACKEND": self.backend,
            "STATEHOUSE_REPLICA_INDEX": str(index),
            "STATEHOUSE_REPLICA_COUNT": str(count),
            **self.storage,
            **self.extra,
        }
        if version is not None:
            env["STATEHOUSE_TOPOLOGY_VERSION"] = str(version)
        return self.root / f"replica-{index}-of-{count}", env

    def restart(self, index: int, sig: int = signal.SIGKILL) -> ServerProcess:
        """Kill replica ``index`` (SIGKILL: no shutdown runs) and start it again in place: the same
        port, data directory and settings (what a pod restart does). Awaits liveness only: a replica
        with a move in its record may start not ready."""
        old = self.servers[index]
        old.stop(sig)
        port = int(old.url.rsplit(":", 1)[1])
        workdir = old.log_path.parent
        self.servers[index] = start_server(workdir, old.settings, port=port, probe="/healthz")
        return self.servers[index]

    def stop(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.stop()


def stored_keys(url: str, job: str, state: str, max_parallelism: int) -> dict[Any, int]:
    """Every key replica ``url`` stores in ``state`` (committed), whatever it owns: key -> key group."""
    found: dict[Any, int] = {}
    cursor: str | None = None
    with httpx.Client(base_url=url, timeout=60) as http:
        while True:
            params: dict[str, Any] = {"key_group_start": 0, "key_group_end": max_parallelism - 1, "limit": 10_000}
            if cursor is not None:
                params["cursor"] = cursor
            response = http.get(f"/v1/jobs/{job}/states/{state}/scan", params=params)
            response.raise_for_status()
            table = pa.ipc.open_stream(response.content).read_all()
            for key, key_group in zip(table["key"].to_pylist(), table["key_group"].to_pylist(), strict=True):
                found[key] = key_group
            raw = (table.schema.metadata or {}).get(NEXT_CURSOR)
            if raw is None:
                return found
            cursor = raw.decode()


def misplaced(
    urls: list[str], job: str, states: list[str], max_parallelism: int, count: int
) -> dict[str, list[tuple[str, Any, int]]]:
    """What replicas store outside their own key groups under a layout of ``count`` replicas (Flink's
    ``computeOperatorIndexForKeyGroup``), per state: ``(url, key, key group)``. ``urls`` are in index
    order; replicas at index >= ``count`` (removed by a rescale) own nothing. Empty lists: every key
    is stored only on its owner."""
    wrong: dict[str, list[tuple[str, Any, int]]] = defaultdict(list)
    for state in states:
        for index, url in enumerate(urls):
            for key, key_group in stored_keys(url, job, state, max_parallelism).items():
                if index >= count or operator_index(max_parallelism, count, key_group) != index:
                    wrong[state].append((url, key, key_group))
    return {state: wrong[state] for state in states}


def holders(urls: list[str], job: str, state: str, max_parallelism: int) -> dict[Any, list[int]]:
    """For each key of ``state``: the indexes of the replicas that store it (one each, when placed right)."""
    held: dict[Any, list[int]] = defaultdict(list)
    for index, url in enumerate(urls):
        for key in stored_keys(url, job, state, max_parallelism):
            held[key].append(index)
    return dict(held)
