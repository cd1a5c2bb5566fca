"""The entry point: ``StatehouseClient(["http://replica-0:8000", ...])``."""

from __future__ import annotations

from typing import Any

from statehouse.client.config import ClientConfig
from statehouse.client.errors import Conflict, NotFound
from statehouse.client.job import JobClient
from statehouse.client.replicas import Replicas


class StatehouseClient:
    """Connections to every replica of one Statehouse deployment, in replica-index order."""

    def __init__(self, urls: str | list[str] | ClientConfig, **options: Any) -> None:
        self.config = urls if isinstance(urls, ClientConfig) else ClientConfig.of(urls, **options)
        self.replicas = Replicas(self.config)

    def create_job(self, name: str, max_parallelism: int | None = None) -> JobClient:
        """Create the job on every replica, or confirm it exists there with this ``max_parallelism``
        (a different one is refused with Conflict); then check the replicas agree on it."""
        body = {"max_parallelism": max_parallelism} if max_parallelism else None
        return self._checked(name, self.replicas.on_all("PUT", f"/v1/jobs/{name}", body))

    def job(self, name: str) -> JobClient:
        """An existing job; NotFound when a replica does not have it, so a misspelled name in a
        backup or a coordinator fails instead of creating an empty job."""
        infos = []
        for replica in self.replicas:
            try:
                infos.append(replica.json("GET", f"/v1/jobs/{name}"))
            except NotFound as exc:
                raise NotFound(
                    f"job {name!r} does not exist on {replica.url}; create it with create_job({name!r}, ...)",
                    status=exc.status,
                    code=exc.code,
                    problem=exc.problem,
                ) from None
        return self._checked(name, infos)

    def topology(self) -> list[dict[str, Any]]:
        """Every replica's ``GET /v1/topology``, in URL order, once they are checked to be one
        complete, consistent replica set: the same set and version, as many replicas as URLs, and
        ``urls[i]`` is replica ``i``. Otherwise Conflict, naming what to fix."""
        shown = self.replicas.on_all("GET", "/v1/topology")
        urls = [replica.url for replica in self.replicas]
        sets = {(info["set_id"], info["version"]) for info in shown}
        if len(sets) != 1:
            found = ", ".join(
                f"{url}: set {i['set_id']!r} version {i['version']}" for url, i in zip(urls, shown, strict=True)
            )
            raise Conflict(
                f"the URLs are not one replica set at one topology version ({found}): list one set's replicas, "
                f"or finish its rescale (docs/operations.md, Rescaling)"
            )
        counts = {info["replica_count"] for info in shown}
        if counts != {len(urls)}:
            raise Conflict(
                f"the replica set has {sorted(counts)[0]} replicas but the client was given {len(urls)} URLs: "
                f"list every replica, in index order"
            )
        for index, (url, info) in enumerate(zip(urls, shown, strict=True)):
            if info["replica_index"] != index:
                order = [i["replica_index"] for i in shown]
                raise Conflict(
                    f"{url} is replica {info['replica_index']}, but the client has it as replica {index} (the URLs "
                    f"are replicas {order} in that order): list the URLs in replica-index order"
                )
        return shown

    def _checked(self, name: str, infos: list[dict[str, Any]]) -> JobClient:
        """The job's client, once every replica is where the URL list says and they agree on the job."""
        for index, info in enumerate(infos):
            if info["replica_count"] != len(self.replicas) or info["replica_index"] != index:
                raise Conflict(
                    f"{self.replicas[index].url} is replica {info['replica_index']} of {info['replica_count']}, "
                    f"but the client has it as replica {index} of {len(self.replicas)}: fix the URL list"
                )
        parallelisms = {info["max_parallelism"] for info in infos}
        if len(parallelisms) != 1:
            raise Conflict(f"replicas disagree on job {name!r}'s max_parallelism: {sorted(parallelisms)}")
        return JobClient(self.replicas, name, parallelisms.pop())

    def close(self) -> None:
        self.replicas.close()

    def __enter__(self) -> StatehouseClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
