"""A job seen from the client: routing by key group, descriptors, batches, operator state."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statehouse.client.batch import Batch
from statehouse.client.errors import InvalidRequest, NotFound, StatehouseError
from statehouse.client.raw import RawKeyedState, RawOperatorState
from statehouse.client.states import (
    HANDLES,
    AggregatingStateHandle,
    ListStateHandle,
    MapStateHandle,
    ReducingStateHandle,
    StateHandle,
    ValueStateHandle,
)
from statehouse.client.timers import TimerServiceHandle
from statehouse.protocol import routes
from statehouse.protocol.keygroups import KEY_TYPES, KeyGroupAssigner, KeyGroupRange, operator_index

if TYPE_CHECKING:
    from collections.abc import Callable

    from statehouse.client.attempts import TaskAttempt
    from statehouse.client.columns import Columns
    from statehouse.client.replicas import Replicas, Routed
    from statehouse.client.transport import ReplicaConnection


# What a job's clients read about it, kept for the process: every Spark task opens a client, and
# Spark reuses its Python workers, so a later task's client asks nothing (Replicas keeps the layout
# the same way). Keyed by the seed URLs, the token (what it may read) and the job; an entry holds
# for the layout version it was checked under. Whatever a replica contradicts is read again.
@dataclass
class KnownJob:
    set_id: str | None
    version: int | None
    max_parallelism: int
    key_types: dict[str, str] = field(default_factory=dict)


_KNOWN: dict[tuple[tuple[str, ...], str | None, str], KnownJob] = {}
_KNOWN_LOCK = threading.Lock()
# Refusals a stale entry explains: the job or the state dropped (and maybe made again, with another
# key type or max_parallelism), keys of the wrong type, a key routed by another max_parallelism.
_STALE_CODES = frozenset({"job_not_found", "state_not_found", "invalid_key", "key_not_owned"})


def _known_key(replicas: Replicas, name: str) -> tuple[tuple[str, ...], str | None, str]:
    return tuple(sorted(url.rstrip("/") for url in replicas.config.urls)), replicas.config.token, name


def known_job(replicas: Replicas, name: str) -> KnownJob | None:
    """The process's entry for the job, if it was checked under the layout ``replicas`` use now."""
    with _KNOWN_LOCK:
        known = _KNOWN.get(_known_key(replicas, name))
    if known is None or (known.set_id, known.version) != (replicas.set_id, replicas.version):
        return None
    return known


def remember_job(replicas: Replicas, name: str, max_parallelism: int) -> KnownJob:
    """Record the job as just read from every replica (its key types are read as they are needed)."""
    known = KnownJob(replicas.set_id, replicas.version, max_parallelism)
    with _KNOWN_LOCK:
        _KNOWN[_known_key(replicas, name)] = known
    return known


def forget_job(replicas: Replicas, name: str) -> None:
    with _KNOWN_LOCK:
        _KNOWN.pop(_known_key(replicas, name), None)


class JobClient:
    """One job of the replica set: routes each key to its owner by the layout in use and the job's
    description (max_parallelism, key types), and opens batches, columnar calls and typed state
    handles over it. A request refused because either changed since it was routed (a live
    rescale, a job or state made again) goes again re-routed (:meth:`reroutes`), so a long-lived
    client follows the set through rescales by itself."""

    def __init__(
        self,
        replicas: Replicas,
        name: str,
        max_parallelism: int,
        *,
        known: KnownJob | None = None,
        reread: Callable[[], JobClient] | None = None,
    ) -> None:
        """``known``: the process's entry for the job (key types are looked up there first);
        ``reread``: how to read the job afresh (``StatehouseClient.job``), for :meth:`refreshed`.
        ``cached``: the job's description came from the process, not from a replica."""
        self.replicas = replicas
        self.name = name
        self.max_parallelism = max_parallelism
        self._key_types: dict[str, str] = {}
        self._assign = KeyGroupAssigner(max_parallelism)
        self._known = known
        self._reread = reread
        self.cached = False
        self._refreshing = threading.Lock()
        self._generation = 0  # times the job was read afresh and that changed it (see routing())

    # -- routing -------------------------------------------------------------------------

    def _checked_key_type(self, state: str, key: Any) -> str:
        key_type = self.key_type(state)
        if not _fits(key, key_type) and self.refreshed():  # the process's key type may be stale
            key_type = self.key_type(state)
        if key_type == "string" and not isinstance(key, str):
            raise InvalidRequest(f"state {state!r} has string keys; got {type(key).__name__} {key!r}")
        if not _fits(key, key_type):
            raise InvalidRequest(f"state {state!r} has {key_type} keys; got {type(key).__name__} {key!r}")
        return key_type

    def key_group(self, state: str, key: Any) -> int:
        key_type = self._checked_key_type(state, key)
        try:
            return self._assign(key, key_type)  # type: ignore[arg-type]
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None

    def replica_for(self, state: str, key: Any) -> int:
        """The replica that owns ``key`` (the same function the server uses to refuse it)."""
        if len(self.replicas) == 1:  # the only replica owns every key: no need to hash
            self._checked_key_type(state, key)
            return 0
        return operator_index(self.max_parallelism, len(self.replicas), self.key_group(state, key))

    def replica_for_key(self, key: Any, key_type: str = "string") -> int:
        """The replica that owns ``key`` of type ``key_type`` (timers name a key type, not a state)."""
        if key_type not in KEY_TYPES:
            raise InvalidRequest(f"key_type must be one of {', '.join(KEY_TYPES)}; got {key_type!r}")
        if (key_type == "string") != isinstance(key, str) or isinstance(key, bool):
            raise InvalidRequest(f"a {key_type} key cannot be {type(key).__name__} {key!r}")
        try:
            key_group = self._assign(key, key_type)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        return operator_index(self.max_parallelism, len(self.replicas), key_group)

    def replica_for_key_group(self, key_group: int) -> int:
        """The replica that owns ``key_group`` (raw keyed state is addressed by key group)."""
        if isinstance(key_group, bool) or not isinstance(key_group, int) or not 0 <= key_group < self.max_parallelism:
            raise InvalidRequest(f"key group must be an integer in [0, {self.max_parallelism - 1}]; got {key_group!r}")
        return operator_index(self.max_parallelism, len(self.replicas), key_group)

    def replica_for_subtask(self, subtask: int) -> int:
        """The replica that keeps operator state of ``subtask`` (managed and raw): subtask i on i % replicas."""
        if isinstance(subtask, bool) or not isinstance(subtask, int) or subtask < 0:
            raise InvalidRequest(f"a subtask index is an integer >= 0; got {subtask!r}")
        return subtask % len(self.replicas)

    def key_group_range(self, replica: int) -> KeyGroupRange:
        return KeyGroupRange.for_operator(self.max_parallelism, len(self.replicas), replica)

    def key_type(self, state: str) -> str:
        """The state's ``key_type`` (``string``, ``int`` or ``long``), read once per state (and
        process: see :class:`KnownJob`)."""
        key_type = self._key_types.get(state)
        if key_type is None and self._known is not None:
            key_type = self._known.key_types.get(state)
            self.cached = self.cached or key_type is not None
        if key_type is None:
            key_type = self.describe(state)["key_type"]
            if self._known is not None:
                self._known.key_types[state] = key_type
        self._key_types[state] = key_type
        return key_type

    def routing(self) -> Routed:
        """What a request is routed under now: the layout's topology version, and how many times
        the job was read afresh since this client was made (:meth:`reroutes` compares them)."""
        return self.replicas.version, self._generation

    def reroutes(self, exc: StatehouseError, routed: Routed, url: str | None, attempt: TaskAttempt | None) -> bool:
        """Whether a refused request (which applied nothing), routed under ``routed`` (see
        :meth:`routing`) and sent to ``url``, goes again, each of its operations to its owner as
        the client routes now. It does when the layout changed (a rescale: a 421 naming a newer
        topology version, a removed replica; :meth:`Replicas.refreshed`), or when what the
        process knew of the job was stale and reading it afresh changed what it routes or types
        keys by (:meth:`refreshed`), or either changed since the request was routed (another
        request saw it first). A request goes again only under a newer layout or description
        than it was routed under, so it is refused again only as often as they change.

        A task attempt's request never goes to a new layout (its epoch spans the old one: the
        micro-batch is re-run), nor goes again when spread over several replicas (a replica's
        requests of an attempt stay in order with their seq; Spark's retry reads the job afresh)."""
        version, generation = routed
        if attempt is None and self.replicas.refreshed(exc, version, url):
            return True
        if exc.code not in _STALE_CODES or (attempt is not None and len(self.replicas) > 1):
            return False
        return self._read_afresh(generation) or (attempt is None and self.replicas.version != version)

    def refreshed(self) -> bool:
        """Whether the job, read afresh because the client refused a key for the type the process
        knew (:class:`KnownJob`), now types or routes keys otherwise."""
        return self._read_afresh(None)

    def _read_afresh(self, generation: int | None) -> bool:
        """Read the job from the replicas if its description came from the process, and say
        whether that changed it; true at once when it was read afresh since ``generation``. The
        process forgets the job first, so its next client reads it afresh too. A job that is gone
        raises NotFound here; a read that fails leaves the description as it was (the next
        refusal reads it again)."""
        with self._refreshing:
            if generation is not None and generation != self._generation:
                return True  # read afresh since the request was routed: it goes again under what was read
            if not self.cached or self._reread is None:
                return False  # read from the replicas already: the refusal is the answer
            changed = self._refresh()
            self.cached = False  # asked now: true for this client from here on
            if changed:
                self._generation += 1
            return changed

    def _refresh(self) -> bool:
        assert self._reread is not None
        forget_job(self.replicas, self.name)
        fresh = self._reread()
        before = (self.max_parallelism, dict(self._key_types))
        self.max_parallelism, self._known = fresh.max_parallelism, fresh._known
        self._assign = KeyGroupAssigner(self.max_parallelism)
        self._key_types = {}
        for state in before[1]:
            with contextlib.suppress(NotFound):  # dropped: using it raises state_not_found
                self.key_type(state)
        return (self.max_parallelism, self._key_types) != before

    # -- descriptors ---------------------------------------------------------------------

    def register(self, name: str, kind: str, **descriptor: Any) -> StateHandle:
        """Register a keyed state on every replica (idempotent) and return its typed handle."""
        body = {"kind": kind, **{k: v for k, v in descriptor.items() if v is not None}}
        self.replicas.on_all("PUT", routes.path(routes.STATE, job=self.name, state=name), body)
        self._key_types[name] = body.get("key_type", "string")
        if self._known is not None:
            self._known.key_types[name] = self._key_types[name]
        return HANDLES[kind](self, name)

    def describe(self, state: str) -> dict[str, Any]:
        return self.replicas[0].json("GET", routes.path(routes.STATE, job=self.name, state=state))

    def state(self, name: str) -> StateHandle:
        return HANDLES[self.describe(name)["kind"]](self, name)

    def _typed(self, name: str, cls: type[StateHandle]) -> Any:
        handle = self.state(name)
        if not isinstance(handle, cls):
            raise InvalidRequest(f"state {name!r} is not a {cls.__name__.removesuffix('StateHandle').lower()} state")
        return handle

    def value_state(self, name: str) -> ValueStateHandle:
        return self._typed(name, ValueStateHandle)

    def list_state(self, name: str) -> ListStateHandle:
        return self._typed(name, ListStateHandle)

    def map_state(self, name: str) -> MapStateHandle:
        return self._typed(name, MapStateHandle)

    def reducing_state(self, name: str) -> ReducingStateHandle:
        return self._typed(name, ReducingStateHandle)

    def aggregating_state(self, name: str) -> AggregatingStateHandle:
        return self._typed(name, AggregatingStateHandle)

    # -- batches and fencing -------------------------------------------------------------

    def batch(
        self, *, epoch: int | None = None, attempt: TaskAttempt | None = None, max_ops: int | None = None
    ) -> Batch:
        """A batch: plain, fenced with ``epoch``, or staged for a task ``attempt`` (see ``client/spark.py``)."""
        return Batch(
            self.replicas,
            self.name,
            self.replica_for,
            epoch=epoch,
            attempt=attempt,
            max_ops=max_ops or self.replicas.config.max_batch_ops,
            route_key=self.replica_for_key,
            route_key_group=self.replica_for_key_group,
            route_subtask=self.replica_for_subtask,
            routing=self.routing,
            reroutes=self.reroutes,
        )

    def raw_keyed(self, epoch: int | None = None) -> RawKeyedState:
        """The job's raw keyed streams, one per key group (``client/raw.py``); ``epoch`` fences the writes."""
        return RawKeyedState(self, epoch)

    def raw_operator(self, epoch: int | None = None) -> RawOperatorState:
        """The job's raw operator partitions per operator subtask (``client/raw.py``)."""
        return RawOperatorState(self, epoch)

    def timers(self, domain: str = "event") -> TimerServiceHandle:
        """The job's timers of ``domain`` (``event`` or ``processing``) on every replica."""
        return TimerServiceHandle(self, domain)

    def columns(
        self,
        attempt: TaskAttempt | None = None,
        *,
        epoch: int | None = None,
        max_rows: int | None = None,
        read_only: str | None = None,
    ) -> Columns:
        """Columnar operations (whole pandas / numpy / Arrow columns, one request per replica):
        plain, fenced with ``epoch``, or staged for a task ``attempt``. Needs the client's
        ``columnar`` extra (pyarrow, numpy, pandas). ``max_rows``: rows per request (default
        the config's ``max_batch_ops``; at most the server's ``STATEHOUSE_MAX_BATCH_OPS``)."""
        from statehouse.client.columns import Columns  # pyarrow, numpy and pandas load only here

        return Columns(self, attempt=attempt, epoch=epoch, max_rows=max_rows, read_only=read_only)

    def fence(self, epoch: int) -> int:
        """Raise the writer epoch on every replica; returns the epoch now in force everywhere."""
        return max(
            e["epoch"] for e in self.replicas.on_all("POST", routes.path(routes.FENCE, job=self.name), {"epoch": epoch})
        )

    def infos(self) -> list[dict[str, Any]]:
        """Every replica's ``GET /v1/jobs/{job}``, in replica order."""
        return self.replicas.on_all("GET", routes.path(routes.JOB, job=self.name))

    def epoch(self) -> int:
        return max(info["epoch"] for info in self.infos())

    def committed_epochs(self) -> list[int]:
        """Per replica, the last micro-batch epoch whose staged writes it committed."""
        return [info["committed_epoch"] for info in self.infos()]

    # -- operator state: subtask i lives on replica i % replica_count --------------------

    def _operator_replica(self, subtask: int) -> ReplicaConnection:
        return self.replicas[self.replica_for_subtask(subtask)]

    def operator_list(self, operator: str, subtask: int, name: str) -> list[Any]:
        path = routes.path(routes.OPERATOR_LIST, job=self.name, operator=operator, index=subtask, name=name)
        try:
            return self._operator_replica(subtask).json("GET", path)["value"]
        except StatehouseError as exc:
            if exc.status == 404 and exc.code == "key_not_found":
                return []
            raise

    def update_operator_list(self, operator: str, subtask: int, name: str, values: list[Any], mode: str = "split"):
        path = routes.path(routes.OPERATOR_LIST, job=self.name, operator=operator, index=subtask, name=name)
        self._operator_replica(subtask).request(
            "PUT", path, idempotent=True, json={"value": list(values)}, params={"mode": mode}
        )


def _fits(key: Any, key_type: str) -> bool:
    """Whether ``key`` is of ``key_type`` as the client sends it (a str, or an int that is no bool)."""
    if key_type == "string":
        return isinstance(key, str)
    return isinstance(key, int) and not isinstance(key, bool)
