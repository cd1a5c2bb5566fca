"""Raw state from the client: a job's byte stream per key group, and byte partitions per
operator subtask (Flink's raw keyed and raw operator state; ``docs/state-model.md``)::

    from statehouse.client.raw import RawKeyedState, RawOperatorState

    raw = job.raw_keyed()                         # job: a JobClient (or RawKeyedState(job))
    raw.update(kg, bloom_filter_bytes)            # on the replica that owns key group kg
    raw.append(kg, more_bytes)
    data = raw.get(kg)                            # b"" when nothing was written

    job.raw_operator().add("source", subtask, b"partition")

In a batch (atomic per replica, and staged under a Spark task attempt like any batch write):
``batch.raw_put(kg, data)``, ``raw_append``, ``raw_get``, ``raw_delete``, ``raw_operator_put``,
``raw_operator_get`` (``client/batch.py``).

A key group's requests go to the replica owning it (the client's routing, the server's owner
check); a 421 naming a newer topology makes the client learn the layout and send once more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import msgpack

from statehouse.client.errors import StatehouseError
from statehouse.protocol import routes

if TYPE_CHECKING:
    from statehouse.client.replicas import Replicas
    from statehouse.client.transport import ReplicaConnection


class RawJob(Protocol):
    """What raw state needs of a job (``client.job.JobClient``, which also makes these handles:
    a protocol, so that it can without an import cycle)."""

    name: str
    replicas: Replicas

    def replica_for_key_group(self, key_group: int) -> int: ...

    def replica_for_subtask(self, subtask: int) -> int: ...


OCTETS = {"content-type": routes.OCTET_STREAM}
MSGPACK_ANSWER = {"accept": routes.MSGPACK}
MSGPACK_BODY = {"content-type": routes.MSGPACK}


def _fenced(epoch: int | None) -> dict[str, int] | None:
    """The query of a write fenced by the job's writer epoch (409 stale_epoch once it moved on)."""
    return None if epoch is None else {"epoch": epoch}


class RawKeyedState:
    """The raw keyed streams of one job: one opaque byte stream per key group. With ``epoch``,
    every write names that writer epoch and is refused (``StaleEpoch``) once the job was fenced past it."""

    def __init__(self, job: RawJob, epoch: int | None = None) -> None:
        self._job = job
        self._params = _fenced(epoch)

    def _send(
        self, method: str, key_group: int, template: str = routes.RAW_KEY_GROUP, content: bytes | None = None
    ) -> bytes:
        """One request to the key group's owner, its answer's body; once more after a layout change
        (a 421 naming a newer topology, or a replica a rescale removed)."""
        job = self._job
        path = routes.path(template, job=job.name, key_group=key_group)
        replicas = job.replicas
        for last in (False, True):
            routed = replicas.version
            connection = replicas[job.replica_for_key_group(key_group)]  # InvalidRequest when out of range
            try:
                # An append is not idempotent: re-sent after a lost answer, it would append twice.
                headers = {**OCTETS, **MSGPACK_ANSWER} if content is not None else None
                params = self._params if method != "GET" else None
                answer = connection.request(
                    method,
                    path,
                    idempotent=template != routes.RAW_KEY_GROUP_APPEND,
                    content=content,
                    headers=headers,
                    params=params,
                )
                return answer.content
            except StatehouseError as exc:
                if last or not replicas.refreshed(exc, routed, connection.url):
                    raise
        raise AssertionError("unreachable")

    def get(self, key_group: int) -> bytes:
        """The key group's stream, whole (``b""`` when nothing was written)."""
        try:
            return self._send("GET", key_group)
        except StatehouseError as exc:
            if _absent(exc):
                return b""
            raise

    def update(self, key_group: int, data: bytes) -> None:
        """Replace the key group's stream (``b""`` clears it)."""
        self._send("PUT", key_group, content=bytes(data))

    def append(self, key_group: int, data: bytes) -> int:
        """Append a part; returns the stream's new length."""
        return int(
            msgpack.unpackb(self._send("POST", key_group, routes.RAW_KEY_GROUP_APPEND, content=bytes(data)))["length"]
        )

    def clear(self, key_group: int) -> None:
        self._send("DELETE", key_group)


def _absent(exc: StatehouseError) -> bool:
    return exc.status == 404 and exc.code == "key_not_found"


class RawOperatorState:
    """Raw operator state of one job: per operator and subtask, a list of byte partitions, on the
    replica the client keeps that subtask's operator state on (``subtask % replicas``); ``epoch``
    as for :class:`RawKeyedState`."""

    def __init__(self, job: RawJob, epoch: int | None = None) -> None:
        self._job = job
        self._params = _fenced(epoch)

    def _path(self, operator: str, subtask: int, template: str = routes.OPERATOR_RAW) -> str:
        return routes.path(template, job=self._job.name, operator=operator, index=subtask)

    def _replica(self, subtask: int) -> ReplicaConnection:
        return self._job.replicas[self._job.replica_for_subtask(subtask)]

    def get(self, operator: str, subtask: int) -> list[bytes]:
        """The subtask's partitions, in order (``[]`` when it holds none)."""
        try:
            answer = self._replica(subtask).request(
                "GET", self._path(operator, subtask), idempotent=True, headers=MSGPACK_ANSWER
            )
        except StatehouseError as exc:
            if _absent(exc):
                return []
            raise
        return list(msgpack.unpackb(answer.content, raw=False)["partitions"])

    def add(self, operator: str, subtask: int, partition: bytes) -> None:
        """Append one partition (not idempotent: not re-sent after a lost answer)."""
        self._replica(subtask).request(
            "POST",
            self._path(operator, subtask, routes.OPERATOR_RAW_PARTITIONS),
            idempotent=False,
            content=bytes(partition),
            headers=OCTETS,
            params=self._params,
        )

    def clear(self, operator: str, subtask: int) -> None:
        self._replica(subtask).request("DELETE", self._path(operator, subtask), idempotent=True, params=self._params)

    def update(self, operator: str, subtask: int, partitions: list[bytes]) -> None:
        """Replace the subtask's partitions, atomically (``[]`` clears them)."""
        body = msgpack.packb({"partitions": [bytes(p) for p in partitions]}, use_bin_type=True)
        self._replica(subtask).request(
            "PUT",
            self._path(operator, subtask),
            idempotent=True,
            content=body,
            headers=MSGPACK_BODY,
            params=self._params,
        )
