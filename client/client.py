"""The entry point: ``StatehouseClient(["http://replica-0:8000", ...])``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statehouse.client.config import ClientConfig
from statehouse.client.errors import Conflict, NotFound, StatehouseError
from statehouse.client.job import JobClient, known_job, remember_job
from statehouse.client.replicas import Replicas
from statehouse.client.transport import ReplicaConnection
from statehouse.protocol import routes


class StatehouseClient:
    """Connections to every replica of one Statehouse deployment, in replica-index order, learned
    from the replicas before the first job. The URLs given are seeds: any order, any that answer,
    one enough when the set advertises its replicas; the client follows the set through live
    rescales by itself (``client/replicas.py``)."""

    def __init__(self, urls: str | list[str] | ClientConfig, **options: Any) -> None:
        self.config = urls if isinstance(urls, ClientConfig) else ClientConfig.of(urls, **options)
        self.replicas = Replicas(self.config)

    def create_job(self, name: str, max_parallelism: int | None = None) -> JobClient:
        """Create the job on every replica, or confirm it exists there with this ``max_parallelism``
        (a different one is refused with Conflict); then check the replicas agree on it."""
        body = {"max_parallelism": max_parallelism} if max_parallelism else None
        if self.replicas.version is None or self.replicas.cached:  # creating: never on a remembered layout
            self.replicas.learn()
        return self._agreed(name, lambda: self.replicas.on_all("PUT", routes.path(routes.JOB, job=name), body))

    def job(self, name: str, *, version: int | None = None) -> JobClient:
        """An existing job; NotFound when a replica does not have it, so a misspelled name in a
        backup or a coordinator fails instead of creating an empty job.

        The layout may come from the process's cache (no round trip per new client); if the
        replicas contradict it (a rescale since), it is learned afresh and the job asked again.
        ``version``: the topology version the caller knows to be current (a Spark task is handed
        its driver's): a layout the process remembers at that version is taken as it is, and so
        is what the process read of the job (no round trip at all: a NotFound, or anything else
        the replicas now contradict, comes with the first request, which is read again and
        re-sent); one older is learned afresh."""
        if self.replicas.version is None:
            self.replicas.learn_cached()
        if version is not None and self.replicas.cached and (self.replicas.version or 0) < version:
            self.replicas.relearn()  # the process's layout is older than the driver's
        checked = not self.replicas.cached or (version is not None and self.replicas.version == version)
        known = known_job(self.replicas, name) if checked else None
        if known is not None:  # read by an earlier client of this process, under this layout
            job = JobClient(self.replicas, name, known.max_parallelism, known=known, reread=lambda: self._job(name))
            job.cached = True
            return job
        if not self.replicas.cached:
            return self._job(name)
        try:
            return self._job(name)
        except StatehouseError:  # the remembered layout is stale: a replica it names was removed
            self.replicas.relearn()
            return self._job(name)

    def _job(self, name: str) -> JobClient:
        return self._agreed(name, lambda: [self._info(replica, name) for replica in self.replicas])

    @staticmethod
    def _info(replica: ReplicaConnection, name: str) -> dict[str, Any]:
        try:
            return replica.json("GET", routes.path(routes.JOB, job=name))
        except NotFound as exc:
            raise NotFound(
                f"job {name!r} does not exist on {replica.url}; create it with create_job({name!r}, ...)",
                status=exc.status,
                code=exc.code,
                problem=exc.problem,
            ) from None

    def topology(self) -> list[dict[str, Any]]:
        """Every replica's ``GET /v1/topology``, in replica-index order, learned afresh from the
        seed URLs (any order; one is enough when the set advertises its replicas' URLs: see
        ``client/replicas.py``). LayoutError, naming what to fix, unless they lead to one whole
        serving replica set at one topology version."""
        return self.replicas.learn()

    def _agreed(self, name: str, read: Callable[[], list[dict[str, Any]]]) -> JobClient:
        """The job's client from every replica's answer about it (``read``, in replica order). A
        replica that reports another place in the set than the layout in use (a rescale since it
        was learned) makes the client learn the layout again and ask again; Conflict when the
        layout learned afresh is the same (the replicas contradict themselves)."""
        infos = read()
        while (moved := self._moved(infos)) is not None:
            if not self.replicas.relearn():
                raise Conflict(moved)
            infos = read()
        return self._checked(name, infos)

    def _moved(self, infos: list[dict[str, Any]]) -> str | None:
        """What a replica reports against the layout in use, if anything."""
        for index, info in enumerate(infos):
            if info["replica_count"] != len(self.replicas) or info["replica_index"] != index:
                return (
                    f"{self.replicas[index].url} is replica {info['replica_index']} of {info['replica_count']}, "
                    f"but the client has it as replica {index} of {len(self.replicas)}: fix the URL list"
                )
        return None

    def _checked(self, name: str, infos: list[dict[str, Any]]) -> JobClient:
        """The job's client, once the replicas (where the layout says) agree on the job."""
        parallelisms = {info["max_parallelism"] for info in infos}
        if len(parallelisms) != 1:
            raise Conflict(f"replicas disagree on job {name!r}'s max_parallelism: {sorted(parallelisms)}")
        max_parallelism = parallelisms.pop()
        known = remember_job(self.replicas, name, max_parallelism)  # for the process's later clients
        return JobClient(self.replicas, name, max_parallelism, known=known, reread=lambda: self._job(name))

    def close(self) -> None:
        self.replicas.close()

    def __enter__(self) -> StatehouseClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
