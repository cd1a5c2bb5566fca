"""Typed state handles with Flink's method names; each call is one request to the owning replica."""

from __future__ import annotations

from typing import Any, Protocol

from statehouse.client.batch import Batch


class BatchOpener(Protocol):
    """What a handle needs of its job (a JobClient): a batch to send its one operation in."""

    def batch(self) -> Batch: ...


class StateHandle:
    def __init__(self, job: BatchOpener, name: str) -> None:
        self._job = job
        self.name = name

    def _one(self, op: str, key: Any, ns: str, **fields: Any) -> Any:
        batch = self._job.batch()
        pending = getattr(batch, op)(self.name, key, *fields.values(), ns=ns)
        batch.flush()
        return pending.value

    def clear(self, key: Any, ns: str = "") -> None:
        self._one("clear", key, ns)


class ValueStateHandle(StateHandle):
    def value(self, key: Any, ns: str = "") -> Any:
        return self._one("get", key, ns)

    get = value

    def update(self, key: Any, value: Any, ns: str = "") -> None:
        self._one("put", key, ns, value=value)


class ListStateHandle(StateHandle):
    def get(self, key: Any, ns: str = "") -> list[Any]:
        return self._one("get", key, ns) or []

    def add(self, key: Any, value: Any, ns: str = "") -> None:
        self._one("add", key, ns, value=value)

    def add_all(self, key: Any, values: list[Any], ns: str = "") -> None:
        self._one("add_all", key, ns, values=list(values))

    def update(self, key: Any, values: list[Any], ns: str = "") -> None:
        self._one("put", key, ns, value=list(values))


class MapStateHandle(StateHandle):
    def get(self, key: Any, user_key: str, ns: str = "") -> Any:
        return self._one("map_get", key, ns, user_key=user_key)

    def put(self, key: Any, user_key: str, value: Any, ns: str = "") -> None:
        self._one("map_put", key, ns, user_key=user_key, value=value)

    def add(self, key: Any, user_key: str, value: Any, ns: str = "") -> None:
        """Fold ``value`` into the entry with the map's ``function``, on the server (atomic)."""
        self._one("map_add", key, ns, user_key=user_key, value=value)

    def put_all(self, key: Any, entries: dict[str, Any], ns: str = "") -> None:
        with self._job.batch() as batch:
            for user_key, value in entries.items():
                batch.map_put(self.name, key, user_key, value, ns)

    def remove(self, key: Any, user_key: str, ns: str = "") -> None:
        self._one("map_remove", key, ns, user_key=user_key)

    def contains(self, key: Any, user_key: str, ns: str = "") -> bool:
        return bool(self._one("map_contains", key, ns, user_key=user_key))

    def entries(self, key: Any, ns: str = "") -> dict[str, Any]:
        return self._one("get", key, ns) or {}

    def keys(self, key: Any, ns: str = "") -> list[str]:
        return list(self.entries(key, ns))

    def values(self, key: Any, ns: str = "") -> list[Any]:
        return list(self.entries(key, ns).values())

    def is_empty(self, key: Any, ns: str = "") -> bool:
        return not self.entries(key, ns)


class ReducingStateHandle(StateHandle):
    """Reducing and aggregating state: ``add`` folds into the server-side built-in function."""

    def get(self, key: Any, ns: str = "") -> Any:
        return self._one("get", key, ns)

    def add(self, key: Any, value: Any, ns: str = "") -> None:
        self._one("add", key, ns, value=value)

    def add_all(self, key: Any, values: list[Any], ns: str = "") -> None:
        self._one("add_all", key, ns, values=list(values))


class AggregatingStateHandle(ReducingStateHandle):
    pass


HANDLES: dict[str, type[StateHandle]] = {
    "value": ValueStateHandle,
    "list": ListStateHandle,
    "map": MapStateHandle,
    "reducing": ReducingStateHandle,
    "aggregating": AggregatingStateHandle,
}
