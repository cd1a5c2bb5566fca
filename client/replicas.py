"""Every replica of one deployment, in replica-index order, with the threads that talk to them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from statehouse.client.config import ClientConfig
from statehouse.client.transport import ReplicaConnection

T = TypeVar("T")


class Replicas:
    """``replicas[i]`` is the connection to replica ``i``.

    ``on_all`` runs one call on every replica at once; ``send_in_order`` hands work to the
    replica's own sender thread, so that what one caller sends to one replica arrives in order
    while the caller goes on working.
    """

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._connections = [
            ReplicaConnection(
                url, token=config.token, timeout=config.timeout, retries=config.retries, backoff=config.backoff
            )
            for url in config.urls
        ]
        self._fan_out = ThreadPoolExecutor(max_workers=len(self._connections), thread_name_prefix="statehouse")
        self._senders = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"statehouse-{i}")
            for i in range(len(self._connections))
        ]

    def __len__(self) -> int:
        return len(self._connections)

    def __getitem__(self, index: int) -> ReplicaConnection:
        return self._connections[index]

    def __iter__(self) -> Iterator[ReplicaConnection]:
        return iter(self._connections)

    def on_all(self, method: str, path: str, body: Any = None, *, idempotent: bool = True) -> list[Any]:
        """The same JSON call on every replica in parallel; the answers in replica order."""
        futures = [self._fan_out.submit(r.json, method, path, body, idempotent=idempotent) for r in self]
        return [f.result() for f in futures]

    def on_each(self, method: str, path: str, bodies: list[Any], *, idempotent: bool = True) -> list[Any]:
        """One JSON call per replica in parallel, ``bodies[i]`` to replica ``i``; the answers in order."""
        calls = zip(self, bodies, strict=True)
        futures = [self._fan_out.submit(r.json, method, path, b, idempotent=idempotent) for r, b in calls]
        return [f.result() for f in futures]

    def send_in_order(self, replica: int, send: Callable[..., T], *args: Any) -> Future[T]:
        return self._senders[replica].submit(send, *args)

    def close(self) -> None:
        self._fan_out.shutdown(wait=True)
        for sender in self._senders:
            sender.shutdown(wait=True)
        for connection in self._connections:
            connection.close()
