"""Every replica of one deployment, in replica-index order, with the threads that talk to them.

The layout (which URL is which replica) is learned from the replicas' ``GET /v1/topology``
(:meth:`Replicas.learn`): URLs in any order are put in index order, one seed URL is enough when
the replicas advertise their peers (``STATEHOUSE_REPLICA_URLS``), and anything that is not one
complete replica set at one topology version is a :class:`LayoutError` saying what to fix. A 421
naming a newer version than the client's makes it learn again (:meth:`Replicas.refreshed`), once
for every caller, so that the refused request can be re-routed instead of failing.

During a live rescale (docs/operations.md, Rescaling) the replicas that are joining the set (empty,
not yet committed) or retired by it are not part of the serving layout and are skipped. The layout
learned from a list of seed URLs is kept per process (:data:`_LAYOUTS`), so that every new client of
the same deployment (each Spark task opens one) routes at once instead of paying a round trip; a
421 naming a newer version, or a cached layout the replicas contradict, replaces it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from statehouse.client.config import ClientConfig, check_url
from statehouse.client.errors import LayoutError, StatehouseError, Unavailable
from statehouse.client.transport import ReplicaConnection

T = TypeVar("T")

Shown = dict[str, Any]  # one replica's GET /v1/topology


@dataclass(frozen=True)
class _Layout:
    set_id: str
    version: int
    urls: tuple[str, ...]  # in replica-index order


# The layout last learned from each tuple of seed URLs, for the whole process (see the module's docstring).
_LAYOUTS: dict[tuple[str, ...], _Layout] = {}
_LAYOUTS_LOCK = threading.Lock()


def serving(shown: Shown) -> bool:
    """Whether a replica's ``GET /v1/topology`` is part of its set's serving layout: not joining a
    set through a live rescale that has not committed yet, not retired by one, and not left
    unassigned by one that was aborted."""
    return not shown.get("retired") and not shown.get("unassigned") and not (shown.get("move") or {}).get("joining")


class Replicas:
    """``replicas[i]`` is the connection to replica ``i``.

    ``on_all`` runs one call on every replica at once; ``send_in_order`` hands work to the
    replica's own sender thread, so that what one caller sends to one replica arrives in order
    while the caller goes on working. Until :meth:`learn` runs, ``urls[i]`` is taken to be
    replica ``i`` as given (``version`` is None).
    """

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.version: int | None = None  # the topology version of the layout in use, once learned
        self.set_id: str | None = None
        self.cached = False  # the layout in use came from the process's cache, not from asking
        self._by_url: dict[str, ReplicaConnection] = {}
        self._connections = [self._connection(url) for url in config.urls]
        self._layout_lock = threading.Lock()
        self._fan_out = ThreadPoolExecutor(max_workers=max(4, len(self._connections)), thread_name_prefix="statehouse")
        self._senders = [self._sender(i) for i in range(len(self._connections))]

    def _connection(self, url: str) -> ReplicaConnection:
        url = url.rstrip("/")
        connection = self._by_url.get(url)
        if connection is None:
            c = self.config
            connection = ReplicaConnection(
                url, token=c.token, timeout=c.timeout, retries=c.retries, backoff=c.backoff, rescale_wait=c.rescale_wait
            )
            self._by_url[url] = connection
        return connection

    @staticmethod
    def _sender(index: int) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"statehouse-{index}")

    def __len__(self) -> int:
        return len(self._connections)

    def __getitem__(self, index: int) -> ReplicaConnection:
        return self._connections[index]

    def __iter__(self) -> Iterator[ReplicaConnection]:
        return iter(self._connections)

    @property
    def urls(self) -> list[str]:
        return [connection.url for connection in self._connections]

    # -- the layout ----------------------------------------------------------------------

    def learn(self) -> list[Shown]:
        """Every replica's ``GET /v1/topology`` in index order, the connections put in that order.

        Every URL must answer and all must be one complete set at one version; with one seed
        URL, the replicas' advertised ``replica_urls`` name the others. Otherwise LayoutError."""
        with self._layout_lock:
            return self._learn(strict=True)

    def learn_cached(self) -> None:
        """The layout this process last learned from the same seed URLs, if any (no round trip);
        otherwise :meth:`learn`. A stale one is replaced on the first 421 naming a newer version."""
        with _LAYOUTS_LOCK:
            layout = _LAYOUTS.get(self._seeds)
        if layout is None:
            self.learn()
            return
        with self._layout_lock:
            self._use([self._connection(url) for url in layout.urls])
            self.set_id, self.version, self.cached = layout.set_id, layout.version, True

    @property
    def _seeds(self) -> tuple[str, ...]:
        return tuple(sorted(url.rstrip("/") for url in self.config.urls))

    def connection(self, url: str) -> ReplicaConnection:
        """The pooled connection to ``url`` (made once per URL)."""
        return self._connection(url)

    def route_to(self, urls: list[str]) -> None:
        """Route by these URLs as replicas 0..n-1 (a rescale's driver, which knows the old set
        while a move is pending and the replicas do not form one set)."""
        with self._layout_lock:
            self._use([self._connection(url) for url in urls])

    def _use(self, connections: list[ReplicaConnection]) -> None:
        for index in range(len(self._senders), len(connections)):
            self._senders.append(self._sender(index))
        self._connections = connections

    def refreshed(self, exc: StatehouseError, routed: int | None, url: str | None = None) -> bool:
        """Whether the request that failed with ``exc``, routed under topology version ``routed``
        (None before any was learned) and sent to ``url``, may be routed again and re-sent, once,
        because the layout changed: a 421 naming a newer version, or ``url`` unreachable and gone
        from the layout the other replicas now report (a rescale removed it). The layout is
        learned once for all the callers that saw the same change."""
        if exc.status == 421:
            version = exc.problem.get("version")
            if not isinstance(version, int) or version <= (routed or 0):
                return False
            with self._layout_lock:
                if self.version is None or self.version < version:
                    self._learn_settled()
                return self.version is not None and self.version >= version
        if not isinstance(exc, Unavailable) or exc.status is not None or url is None:
            return False  # only a replica that did not answer at all may have been removed
        with self._layout_lock:
            if self.version == routed:
                try:
                    self._learn(strict=False)
                except StatehouseError:
                    return False  # no complete newer layout: the replica is down, not removed
            return self.version != routed and url not in self.urls

    def _learn_settled(self) -> list[Shown]:
        """A refresh's learning; while a live rescale's commit reaches the replicas one after the
        other (some at the new version, some not yet), the set is incomplete for a moment: asked
        again, for at most the config's ``rescale_wait``."""
        deadline = time.monotonic() + self.config.rescale_wait
        while True:
            try:
                return self._learn(strict=False)
            except LayoutError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _learn(self, *, strict: bool) -> list[Shown]:
        """``strict``: every known URL must answer, at one version. Otherwise (a refresh after a
        421) the replicas that do not answer, or answer an older version, are left out: a rescale
        removed or has not yet restarted them."""
        answered = self._ask(self.urls, strict)
        skipped = [url for url, shown in answered.items() if not serving(shown)]
        answered = {url: shown for url, shown in answered.items() if serving(shown)}
        if not answered and skipped:
            raise LayoutError(
                f"{', '.join(skipped)} are joining, retired or unassigned by a live rescale, not serving: give the "
                f"URL of a serving replica (statehouse status)"
            )
        if not answered:
            raise LayoutError(
                f"no replica answered GET /v1/topology ({', '.join(self.urls)}): start them, or fix the URLs"
            )
        if not strict:
            newest = max(shown["version"] for shown in answered.values())
            answered = {url: shown for url, shown in answered.items() if shown["version"] == newest}
        advertised: list[str] = next((s["replica_urls"] for s in answered.values() if s.get("replica_urls")), [])
        known = {shown["replica_index"] for shown in answered.values()}
        peers = [url for i, url in enumerate(advertised) if i not in known and url not in answered]
        if peers:
            answered.update({url: shown for url, shown in self._ask(peers, strict).items() if serving(shown)})
        ordered = _ordered(answered)
        self._use([self._connection(url) for url, _shown in ordered])
        first = ordered[0][1]
        self.set_id, self.version, self.cached = first["set_id"], first["version"], False
        with _LAYOUTS_LOCK:
            remembered = _LAYOUTS.get(self._seeds)
            if remembered is None or remembered.set_id != self.set_id or remembered.version <= self.version:
                _LAYOUTS[self._seeds] = _Layout(self.set_id, self.version, tuple(url for url, _shown in ordered))
        return [shown for _url, shown in ordered]

    def _ask(self, urls: list[str], strict: bool) -> dict[str, Shown]:
        """``GET /v1/topology`` of each URL in parallel: the answers by URL (strict: all of them)."""
        for url in urls:
            check_url(url)
        futures = {url: self._fan_out.submit(self._connection(url).json, "GET", "/v1/topology") for url in urls}
        answered = {}
        for url, future in futures.items():
            try:
                answered[url.rstrip("/")] = future.result()
            except StatehouseError as exc:
                if strict:  # the same kind of error (Unavailable stays worth retrying), naming the URL
                    raise type(exc)(
                        f"{url} did not answer GET /v1/topology ({exc.detail}): start that replica, or fix its URL",
                        status=exc.status,
                        code=exc.code,
                        problem=exc.problem,
                    ) from exc
        return answered

    # -- calls ---------------------------------------------------------------------------

    def on_all(self, method: str, path: str, body: Any = None, *, idempotent: bool = True) -> list[Any]:
        """The same JSON call on every replica in parallel; the answers in replica order."""
        futures = [self._fan_out.submit(r.json, method, path, body, idempotent=idempotent) for r in self]
        return [f.result() for f in futures]

    def submit(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``call`` on the fan-out threads (one call per replica at once: see :meth:`on_all`)."""
        return self._fan_out.submit(call, *args, **kwargs)

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
        for connection in self._by_url.values():
            connection.close()


def _ordered(answered: dict[str, Shown]) -> list[tuple[str, Shown]]:
    """The (URL, topology) pairs in replica-index order, once they are one complete replica set at
    one topology version; otherwise LayoutError naming what to fix."""
    found = "; ".join(
        f"{url} is replica {s['replica_index']} of {s['replica_count']} of set {s['set_id']!r} version {s['version']}"
        for url, s in answered.items()
    )
    if len({shown["set_id"] for shown in answered.values()}) > 1:
        raise LayoutError(f"the URLs are replicas of different replica sets ({found}): list one set's replicas")
    if len({(shown["version"], shown["replica_count"]) for shown in answered.values()}) > 1:
        raise LayoutError(
            f"the replicas are at different topology versions ({found}): a rescale is under way; finish it "
            f"(statehouse rescale, docs/operations.md, Rescaling) or list the replicas of one version"
        )
    by_index: dict[int, str] = {}
    for url, shown in answered.items():
        index = shown["replica_index"]
        if index in by_index:
            raise LayoutError(
                f"{by_index[index]} and {url} are both replica {index}: give each replica's URL once ({found})"
            )
        by_index[index] = url
    first = next(iter(answered.values()))
    count = first["replica_count"]
    missing = [i for i in range(count) if i not in by_index]
    if missing:
        raise LayoutError(
            f"replica set {first['set_id']!r} has {count} replicas (topology version {first['version']}), but no URL "
            f"given is replica {', '.join(map(str, missing))}: add its URL (or set STATEHOUSE_REPLICA_URLS on the "
            f"replicas, so that one URL is enough)"
        )
    return [(by_index[i], answered[by_index[i]]) for i in range(count)]
