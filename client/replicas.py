"""Every replica of one deployment, in replica-index order, with the threads that talk to them.

The URLs a client is given are seeds, not a layout: the layout (which URL is which replica, the
set's identity and topology version) is learned from the replicas' ``GET /v1/topology``
(:meth:`Replicas.learn`). Any seed that answers will do: the newest version a serving replica
answers is the layout, its URLs are those that answered at that version plus the ``replica_urls``
the set advertises (``STATEHOUSE_REPLICA_URLS``, and every live rescale's new set), so one seed is
enough, the seeds may be in any order, and a seed that does not answer, or is a replica a live
rescale retired, removed, left unassigned or has not yet let join, is skipped. A set that
advertises no URLs must be given whole. URLs of two replica sets, or two URLs at one index, are a
:class:`LayoutError` saying what to fix.

A 421 naming a newer version than the one a request was routed under, a replica that reports
another place in the set than the layout says (``StatehouseClient``), or a replica that stopped
answering and is gone from the set the others report, makes the client learn again
(:meth:`Replicas.refreshed`, :meth:`Replicas.relearn`), once for every caller that saw the same
change, waiting out a live rescale's commit on its way to the replicas (at most the config's
``rescale_wait``); the refused request is then re-routed instead of failing. A rescale grows or
shrinks the layout under a running client: a client configured before a grow routes to the new
replicas, one configured before a shrink keeps working once the removed replicas are gone.

The layout learned from a list of seed URLs is kept per process (:data:`_LAYOUTS`), so that every
new client of the same deployment (each Spark task opens one) routes at once instead of paying a
round trip; a 421 naming a newer version, or a cached layout the replicas contradict, replaces it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from statehouse.client.config import ClientConfig
from statehouse.client.errors import LayoutError, StatehouseError, Unavailable
from statehouse.client.transport import ReplicaConnection
from statehouse.protocol import routes
from statehouse.protocol.urls import check_url

T = TypeVar("T")

Shown = dict[str, Any]  # one replica's GET /v1/topology
# What a request was routed under: the layout's topology version, and the job description's
# generation (``JobClient._generation``): a refused request goes again only under newer ones.
Routed = tuple[int | None, int]


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

        The set is learned from the seeds (the configured URLs) and the layout in use: any of them
        that answers will do, those that do not answer, and replicas that are not serving (retired,
        unassigned, joining), are skipped; the set's own ``replica_urls`` name the replicas the
        seeds do not. Every replica of the set learned must answer, at its newest version.
        Otherwise LayoutError (or Unavailable, naming a seed that did not answer)."""
        with self._layout_lock:
            return self._learn(strict=True)

    def learn_cached(self) -> None:
        """The layout this process last learned from the same seed URLs, if any (no round trip);
        otherwise :meth:`learn`, waiting out a live rescale's commit reaching the replicas. A
        stale one is replaced on the first 421 naming a newer version."""
        with _LAYOUTS_LOCK:
            layout = _LAYOUTS.get(self._seeds)
        with self._layout_lock:
            if layout is None:
                self._learn_settled(strict=True)
                return
            self._use([self._connection(url) for url in layout.urls])
            self.set_id, self.version, self.cached = layout.set_id, layout.version, True

    def relearn(self) -> bool:
        """Learn the layout afresh, as a refresh does (a replica reported another place in the
        set than the layout in use says), waiting out a live rescale's commit on its way; whether
        the topology version changed."""
        with self._layout_lock:
            before = self.version
            self._learn_settled(strict=False)
            return self.version != before

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
        (None before any was learned) and sent to ``url``, may be routed again and re-sent
        because the layout changed: a 421 naming a newer version, or ``url`` unreachable and gone
        from the layout the other replicas now report (a rescale removed it). The layout is
        learned once for all the callers that saw the same change; a re-sent request refused
        again goes again only if the refusal names a version newer than it was re-routed under."""
        if exc.status == 421:
            version = exc.problem.get("version")
            if not isinstance(version, int) or version <= (routed or 0):
                return False
            with self._layout_lock:
                if self.version is None or self.version < version:
                    self._learn_settled(strict=False, at_least=version)
                return self.version is not None and self.version >= version
        if not isinstance(exc, Unavailable) or exc.status is not None or url is None:
            return False  # only a replica that did not answer at all may have been removed
        with self._layout_lock:
            if self.version == routed:
                try:
                    self._learn(strict=False)
                except StatehouseError:
                    return False  # no complete newer layout: the replica is down, not removed
            return self.version != routed and url.rstrip("/") not in self.urls

    def _learn_settled(self, *, strict: bool, at_least: int | None = None) -> list[Shown]:
        """:meth:`_learn`, while a live rescale's commit reaches the replicas one after the other
        (some at the new version, some not yet: the set is incomplete for a moment), or until the
        layout is at version ``at_least``: asked again, for at most the config's ``rescale_wait``."""
        deadline = time.monotonic() + self.config.rescale_wait
        while True:
            try:
                shown = self._learn(strict=strict)
                if at_least is None or (self.version or 0) >= at_least or time.monotonic() > deadline:
                    return shown
            except _Unsettled:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def _learn(self, *, strict: bool) -> list[Shown]:
        """The layout from whatever answers (see :meth:`learn`). ``strict``: every replica of the
        set must answer, at the set's newest version; otherwise (a refresh) a replica the set
        advertises is routed to even if it did not answer (it may be restarting: its requests say
        so) or is not at the new version yet (a commit on its way: it answers 503 meanwhile)."""
        answered, failed = self._survey()
        ordered = _layout(answered, failed, strict)
        self._use([self._connection(url) for url, _shown in ordered])
        first = next(shown for _url, shown in ordered if shown is not None)
        self.set_id, self.version, self.cached = first["set_id"], first["version"], False
        with _LAYOUTS_LOCK:
            remembered = _LAYOUTS.get(self._seeds)
            if remembered is None or remembered.set_id != self.set_id or remembered.version <= self.version:
                _LAYOUTS[self._seeds] = _Layout(self.set_id, self.version, tuple(url for url, _shown in ordered))
        return [shown for _url, shown in ordered if shown is not None]

    def _survey(self) -> tuple[dict[str, Shown], dict[str, StatehouseError]]:
        """``GET /v1/topology`` of the layout in use, the seeds, and every URL their answers
        advertise (``replica_urls``), in parallel rounds: the answers, and the errors, by URL."""
        answered: dict[str, Shown] = {}
        failed: dict[str, StatehouseError] = {}
        todo = _unique([*self.urls, *self.config.urls])
        while todo:
            futures = {url: self._fan_out.submit(self._connection(url).json, "GET", routes.TOPOLOGY) for url in todo}
            for url, future in futures.items():
                try:
                    answered[url] = future.result()
                except StatehouseError as exc:
                    failed[url] = exc
            advertised = [u for url in todo if url in answered for u in answered[url].get("replica_urls") or []]
            todo = [url for url in _unique(advertised) if url not in answered and url not in failed and _valid(url)]
        return answered, failed

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


class _Unsettled(LayoutError):
    """The replicas that answered are at different topology versions and the newest are not a
    whole set yet: a live rescale's commit is on its way (worth asking again shortly)."""


def _unique(urls: list[str]) -> list[str]:
    return list(dict.fromkeys(url.rstrip("/") for url in urls))


def _valid(url: str) -> bool:
    try:
        check_url(url)
    except ValueError:
        return False
    return True


def _committing(shown: Shown | None, version: int) -> bool:
    """Whether a replica is joining the move to ``version`` that other replicas already serve: the
    coordinator's commit reaches the replicas one after the other."""
    move = (shown or {}).get("move") or {}
    return bool(move.get("joining")) and move.get("version") == version


def _found(answered: dict[str, Shown]) -> str:
    return "; ".join(
        f"{url} is replica {s['replica_index']} of {s['replica_count']} of set {s['set_id']!r} version {s['version']}"
        for url, s in answered.items()
    )


def _unanswered(failed: dict[str, StatehouseError]) -> StatehouseError:
    """The seeds that did not answer, as the first one's kind of error (Unavailable stays worth retrying)."""
    (url, exc), *others = failed.items()
    also = f" (nor did {', '.join(u for u, _e in others)})" if others else ""
    return type(exc)(
        f"{url} did not answer GET /v1/topology ({exc.detail}){also}: start that replica, or fix its URL",
        status=exc.status,
        code=exc.code,
        problem=exc.problem,
    )


def _layout(
    answered: dict[str, Shown], failed: dict[str, StatehouseError], strict: bool
) -> list[tuple[str, Shown | None]]:
    """The (URL, topology) pairs of the set's serving layout in replica-index order (topology None:
    a replica its set advertises that did not answer, only when not ``strict``); otherwise
    LayoutError (or the error of a seed that did not answer) naming what to fix.

    The newest version any serving replica answers is the layout: a replica at an older one has
    not committed a live rescale yet (or was skipped by it). Its URLs are those that answered at
    that version, completed from the ``replica_urls`` the set advertises; a set that advertises
    none must be given whole."""
    if len({shown["set_id"] for shown in answered.values()}) > 1:
        raise LayoutError(
            f"the URLs are replicas of different replica sets ({_found(answered)}): list one set's replicas"
        )
    live = {url: shown for url, shown in answered.items() if serving(shown)}
    if not live and answered:
        raise LayoutError(
            f"{', '.join(answered)} are joining, retired or unassigned by a live rescale, not serving: give the "
            f"URL of a serving replica (statehouse status)"
        )
    if not live:
        raise _unanswered(failed)
    newest = max(shown["version"] for shown in live.values())
    current = {url: shown for url, shown in live.items() if shown["version"] == newest}
    behind = {url: shown for url, shown in live.items() if shown["version"] != newest}
    found = _found(live)
    if len({shown["replica_count"] for shown in current.values()}) > 1:
        raise LayoutError(
            f"the replicas disagree on their count at topology version {newest} ({found}): see their logs"
        )
    first = next(iter(current.values()))
    count = first["replica_count"]
    by_index: dict[int, str] = {}
    for url, shown in current.items():
        index = shown["replica_index"]
        if index in by_index:
            raise LayoutError(
                f"{by_index[index]} and {url} are both replica {index}: give each replica's URL once ({found})"
            )
        by_index[index] = url
    advertised = next(
        (_unique(s["replica_urls"]) for s in current.values() if len(s.get("replica_urls") or []) == count), None
    )
    missing = [i for i in range(count) if i not in by_index]
    if missing and advertised is not None:
        for index in missing:
            url = advertised[index]
            if url in current:
                raise LayoutError(
                    f"the set advertises {url} as replica {index}, but it is replica {current[url]['replica_index']} "
                    f"({found}): fix STATEHOUSE_REPLICA_URLS on the replicas"
                )
            if (strict and url in behind) or _committing(answered.get(url), newest):
                raise _Unsettled(
                    f"the replicas are at different topology versions ({found}): a live rescale is committing; "
                    f"ask again in a moment (if this lasts, finish it: statehouse rescale --resume)"
                )
            if strict and url in failed:
                raise _unanswered({url: failed[url]})
            if strict or (url in answered and url not in behind):
                raise LayoutError(
                    f"replica {index} of set {first['set_id']!r} ({url}) is not serving (retired, unassigned or "
                    f"joining): finish the live rescale (statehouse rescale --resume) or fix the set's replica URLs"
                )
            by_index[index] = url
    elif missing:
        if behind:
            raise _Unsettled(
                f"the replicas are at different topology versions ({found}): a rescale is under way; finish it "
                f"(statehouse rescale, docs/operations.md, Rescaling) or list the replicas of one version"
            )
        if failed:
            raise _unanswered(failed)  # the missing replica may be the one that did not answer
        raise LayoutError(
            f"replica set {first['set_id']!r} has {count} replicas (topology version {newest}), but no URL "
            f"given is replica {', '.join(map(str, missing))}: add its URL (or set STATEHOUSE_REPLICA_URLS on the "
            f"replicas, so that one URL is enough)"
        )
    return [(by_index[i], current.get(by_index[i])) for i in range(count)]
