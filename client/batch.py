"""Batching: queue many keyed operations, send one msgpack request per replica."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from statehouse.client.errors import StatehouseError
from statehouse.protocol.ops import IDEMPOTENT_OPS, OPS, READ_OPS

if TYPE_CHECKING:
    from statehouse.client.attempts import TaskAttempt
    from statehouse.client.replicas import Replicas, Routed

# A batch made only of idempotent operations may be retried after a timeout (``add`` is not
# one); the server stages everything but the reads of an attempt: ``protocol/ops.py`` says which.
_UNSET = object()


class PendingResult:
    """The result of a queued operation, available after the batch is flushed."""

    __slots__ = ("_result",)

    def __init__(self) -> None:
        self._result: Any = _UNSET

    @property
    def done(self) -> bool:
        return self._result is not _UNSET

    @property
    def value(self) -> Any:
        if self._result is _UNSET:
            raise RuntimeError("the batch has not been flushed yet")
        return self._result.get("value")


class Batch:
    """Operations grouped per owning replica and sent as one atomic msgpack batch each.

    Each replica's part is atomic and ordered; parts on different replicas are independent
    (a failure on one replica does not undo another's). Use as a context manager to flush on
    exit, or call :meth:`flush`. ``epoch`` fences the writes (see the coordinator); with
    ``attempt`` (a Spark task attempt) they are staged until the driver commits the epoch, the
    reads see them, and every request may be retried (a re-sent one is not applied twice).

    When a replica's part reaches ``max_ops`` it is sent at once, in the background, while
    the caller goes on queueing (client and server work in parallel). Parts for one replica
    are sent one after the other, in order; if one fails, the later ones are not sent.
    """

    def __init__(
        self,
        replicas: Replicas,
        job: str,
        route: Callable[[str, Any], int],
        *,
        epoch: int | None = None,
        attempt: TaskAttempt | None = None,
        max_ops: int = 5000,
        route_key: Callable[[Any, str], int] | None = None,
        route_key_group: Callable[[int], int] | None = None,
        route_subtask: Callable[[int], int] | None = None,
        routing: Callable[[], Routed] | None = None,
        reroutes: Callable[[StatehouseError, Routed, str | None, TaskAttempt | None], bool] | None = None,
    ) -> None:
        self._replicas = replicas
        self._job = job
        self._route = route  # (state, key) -> index of the replica that owns the key
        self._route_key = route_key  # (key, key type) -> the same, for timers (they name no state)
        self._route_key_group = route_key_group  # key group -> its owner, for raw keyed state
        self._route_subtask = route_subtask  # subtask -> the replica keeping it, for raw operator state
        # What the operations are routed under now, and whether a refusal routed under an earlier
        # one goes again (JobClient.routing, JobClient.reroutes); without a job: the layout only.
        self._routing = routing or (lambda: (replicas.version, 0))
        self._reroutes = reroutes or (
            lambda exc, routed, url, attempt: attempt is None and replicas.refreshed(exc, routed[0], url)
        )
        self.epoch = attempt.epoch if attempt is not None else epoch
        self.attempt = attempt
        self.max_ops = max_ops
        self._queued: list[list[tuple[dict[str, Any], PendingResult]]] = [[] for _ in range(len(replicas))]
        self._sending: list[Future[None]] = []
        self._failure: BaseException | None = None  # the first part's error; later parts are not sent
        self._routed = self._routing()  # what the queued operations were routed under

    def _owner(self, op: dict[str, Any]) -> int:
        """The replica an operation goes to, by what it acts on (``protocol/ops.py``: its target)."""
        target = OPS[op["op"]].target
        if target == "state":
            return self._route(op["state"], op["key"])
        if target == "timer" and self._route_key is not None:
            return self._route_key(op["key"], op["key_type"])
        if target == "raw_keyed" and self._route_key_group is not None:
            return self._route_key_group(op["key_group"])
        if target == "raw_operator" and self._route_subtask is not None:
            return self._route_subtask(op["subtask"])
        raise RuntimeError("this batch routes by state only: make it with JobClient.batch()")

    def _queue(self, op: dict[str, Any]) -> PendingResult:
        replica = self._owner(op)
        while len(self._queued) <= replica:  # a refreshed layout has more replicas
            self._queued.append([])
        pending = PendingResult()
        queue = self._queued[replica]
        queue.append((op, pending))
        if len(queue) >= self.max_ops:
            self._send_in_background(replica)
        return pending

    def _take(self, replica: int) -> list[tuple[dict[str, Any], PendingResult]]:
        chunk, self._queued[replica] = self._queued[replica], []
        return chunk

    def _send_in_background(self, replica: int) -> None:
        # One sender thread per replica keeps this batch's parts for it in order.
        self._sending.append(self._replicas.send_in_order(replica, self._send, replica, self._take(replica)))

    def _send(self, replica: int, chunk: list[tuple[dict[str, Any], PendingResult]]) -> None:
        if self._failure is not None:
            raise StatehouseError("not sent: an earlier part of this batch failed") from self._failure
        attempt = self.attempt
        if attempt is not None:
            fields, idempotent = attempt.fields(replica), True
        else:
            fields = {"epoch": self.epoch} if self.epoch is not None else {}
            idempotent = all(op["op"] in IDEMPOTENT_OPS for op, _pending in chunk)
        try:
            if attempt is None and self._routed != self._routing():
                self._resend(chunk, fields, idempotent)  # queued before the layout or the job was read afresh
            else:
                self._deliver(replica, chunk, self._routed, fields, idempotent)
        except BaseException as exc:
            if self._failure is None:
                self._failure = exc
            raise

    def _deliver(
        self,
        replica: int,
        chunk: list[tuple[dict[str, Any], PendingResult]],
        routed: Routed,
        fields: dict[str, Any],
        idempotent: bool,
    ) -> None:
        """One replica's part, routed under ``routed``. A refusal that a changed layout (a
        rescale) or a job read afresh explains (``reroutes``) applied nothing: the part goes
        again, each operation to its owner as the client routes now; a task attempt's only to
        the same single replica with the same seq (its epoch spans the old layout)."""
        attempt = self.attempt
        ops = [op for op, _pending in chunk]
        try:
            connection = self._replicas[replica]
        except IndexError:  # the layout shrank since the part was routed
            if attempt is not None:
                raise
            self._resend(chunk, fields, idempotent)
            return
        try:
            results = connection.batch(self._job, ops, fields=fields, idempotent=idempotent)
        except StatehouseError as exc:
            if self._reroutes(exc, routed, connection.url, attempt):
                self._resend(chunk, fields, idempotent)
                return
            if attempt is not None and 400 <= (exc.status or 0) < 500:
                attempt.refused(replica, fields["seq"])  # answered with an error: nothing staged
            raise
        if attempt is not None:
            attempt.answered(replica, sum(op["op"] not in READ_OPS for op in ops))
        for (_op, pending), result in zip(chunk, results, strict=True):
            pending._result = result

    def _resend(self, chunk: list[tuple[dict[str, Any], PendingResult]], fields: dict[str, Any], idempotent: bool):
        """A refused part, each operation to its owner as the client routes now."""
        routed = self._routing()
        parts: dict[int, list[tuple[dict[str, Any], PendingResult]]] = {}
        for op, pending in chunk:
            parts.setdefault(self._owner(op), []).append((op, pending))
        for replica, part in parts.items():
            self._deliver(replica, part, routed, fields, idempotent)

    @staticmethod
    def _op(op: str, state: str, key: Any, ns: str, **fields: Any) -> dict[str, Any]:
        body = {"op": op, "state": state, "key": key, **fields}
        if ns:
            body["ns"] = ns
        return body

    def get(self, state: str, key: Any, ns: str = "") -> PendingResult:
        return self._queue(self._op("get", state, key, ns))

    def put(self, state: str, key: Any, value: Any, ns: str = "") -> PendingResult:
        return self._queue(self._op("put", state, key, ns, value=value))

    def add(self, state: str, key: Any, value: Any, ns: str = "") -> PendingResult:
        return self._queue(self._op("add", state, key, ns, value=value))

    def add_all(self, state: str, key: Any, values: list[Any], ns: str = "") -> PendingResult:
        return self._queue(self._op("add", state, key, ns, values=list(values)))

    def clear(self, state: str, key: Any, ns: str = "") -> PendingResult:
        return self._queue(self._op("clear", state, key, ns))

    def map_get(self, state: str, key: Any, user_key: str, ns: str = "") -> PendingResult:
        return self._queue(self._op("map_get", state, key, ns, user_key=user_key))

    def map_put(self, state: str, key: Any, user_key: str, value: Any, ns: str = "") -> PendingResult:
        return self._queue(self._op("map_put", state, key, ns, user_key=user_key, value=value))

    def map_add(self, state: str, key: Any, user_key: str, value: Any, ns: str = "") -> PendingResult:
        return self._queue(self._op("map_add", state, key, ns, user_key=user_key, value=value))

    def map_remove(self, state: str, key: Any, user_key: str, ns: str = "") -> PendingResult:
        return self._queue(self._op("map_remove", state, key, ns, user_key=user_key))

    def map_contains(self, state: str, key: Any, user_key: str, ns: str = "") -> PendingResult:
        return self._queue(self._op("map_contains", state, key, ns, user_key=user_key))

    def register_timer(
        self, key: Any, timestamp: int, ns: str = "", *, domain: str = "event", key_type: str = "string"
    ) -> PendingResult:
        """Register a timer of ``key`` (typed ``key_type``) at ``timestamp`` ms in ``domain``
        (``event`` or ``processing``); registering it again is a no-op."""
        return self._timer("register_timer", key, timestamp, ns, domain, key_type)

    def delete_timer(
        self, key: Any, timestamp: int, ns: str = "", *, domain: str = "event", key_type: str = "string"
    ) -> PendingResult:
        return self._timer("delete_timer", key, timestamp, ns, domain, key_type)

    def _timer(self, op: str, key: Any, timestamp: int, ns: str, domain: str, key_type: str) -> PendingResult:
        body = {"op": op, "domain": domain, "key": key, "key_type": key_type, "timestamp": timestamp}
        if ns:
            body["ns"] = ns
        return self._queue(body)

    # -- raw state (Flink's raw keyed and raw operator state; ``client/raw.py`` for single calls) --

    def raw_get(self, key_group: int) -> PendingResult:
        """The key group's raw stream, whole (``None`` when nothing was written)."""
        return self._queue({"op": "raw_get", "key_group": key_group})

    def raw_put(self, key_group: int, data: bytes) -> PendingResult:
        """Replace the key group's raw stream (``b""`` clears it)."""
        return self._queue({"op": "raw_put", "key_group": key_group, "value": bytes(data)})

    def raw_append(self, key_group: int, data: bytes) -> PendingResult:
        """Append a part to the key group's raw stream (not idempotent: a timed-out batch holding
        one is not re-sent, unless it is a task attempt's)."""
        return self._queue({"op": "raw_append", "key_group": key_group, "value": bytes(data)})

    def raw_delete(self, key_group: int) -> PendingResult:
        return self._queue({"op": "raw_delete", "key_group": key_group})

    def raw_operator_get(self, operator: str, subtask: int) -> PendingResult:
        """The subtask's raw partitions, in order (``[]`` when it holds none)."""
        return self._queue({"op": "raw_operator_get", "operator": operator, "subtask": subtask})

    def raw_operator_put(self, operator: str, subtask: int, partitions: list[bytes]) -> PendingResult:
        """Replace the subtask's raw partitions (``[]`` clears them)."""
        body = {"op": "raw_operator_put", "operator": operator, "subtask": subtask}
        return self._queue({**body, "value": [bytes(p) for p in partitions]})

    def flush(self) -> None:
        """Send everything queued (replicas in parallel) and wait for every part; raises the
        first part's error. With nothing in flight and one replica to send to, it sends inline."""
        busy = [i for i, queue in enumerate(self._queued) if queue]
        if not self._sending and len(busy) == 1:
            self._send(busy[0], self._take(busy[0]))
            return
        for replica in busy:
            self._send_in_background(replica)
        sending, self._sending = self._sending, []
        errors = [future.exception() for future in sending]
        if any(e is not None for e in errors):
            # The cause, not a later part's "not sent" that a parallel sender may have finished first.
            raise self._failure or next(e for e in errors if e is not None)

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.flush()
