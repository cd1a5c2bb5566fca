"""Typed state handles with Flink's method names; each call is one request to the owning replica.

The ``*_many`` methods take whole columns (pandas, numpy, Arrow, lists) and send one Arrow
request per replica (``client/columns.py``; they need the client's ``columnar`` extra)::

    spent = job.reducing_state("spent")
    spent.add_many(df["user_id"], df["amount"])
    df["total"] = spent.get_many(df["user_id"])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from statehouse.client.batch import Batch

if TYPE_CHECKING:
    from statehouse.client.columns import Columns


class BatchOpener(Protocol):
    """What a handle needs of its job (a JobClient): a batch to send its one operation in, and
    the columnar operations for the ``*_many`` methods."""

    def batch(self) -> Batch: ...

    def columns(self) -> Columns: ...


class StateHandle:
    """One keyed state of a job, as Flink's state interfaces show it (``job.value_state(name)``
    and its siblings): each one-key method is one batch (of one operation; ``put_all``'s of one
    per entry) sent to the key's owner and answered before it returns; each ``*_many`` method is
    one columnar request per owner over a whole column of keys. Keys are of the state's key
    type, ``ns`` its namespace (default "")."""

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

    def clear_many(self, keys: Any, ns: Any = "") -> int:
        """Clear every key of the column; returns the rows sent."""
        return self._job.columns().clear(self.name, keys, ns)


class ValueStateHandle(StateHandle):
    """A value state (Flink's ``ValueState``): one value per key, ``None`` (or the state's
    default) where none was put."""

    def value(self, key: Any, ns: str = "") -> Any:
        return self._one("get", key, ns)

    get = value

    def update(self, key: Any, value: Any, ns: str = "") -> None:
        self._one("put", key, ns, value=value)

    def get_many(self, keys: Any, ns: Any = "", *, as_arrow: bool = False) -> Any:
        """Every key's value: a ``pandas.Series`` in the keys' order (a Series' index kept), or
        a ``pyarrow.Array`` with ``as_arrow``; null where absent."""
        return self._job.columns().get(self.name, keys, ns, as_arrow=as_arrow)

    def put_many(self, keys: Any, values: Any, ns: Any = "") -> int:
        """Set each key's value (a null value clears); in row order, so the last of a duplicate key wins."""
        return self._job.columns().put(self.name, keys, values, ns)


class ListStateHandle(StateHandle):
    """A list state (Flink's ``ListState``): a list per key, appended to or replaced whole; ``[]``
    where it holds none."""

    def get(self, key: Any, ns: str = "") -> list[Any]:
        return self._one("get", key, ns) or []

    def add(self, key: Any, value: Any, ns: str = "") -> None:
        self._one("add", key, ns, value=value)

    def add_all(self, key: Any, values: list[Any], ns: str = "") -> None:
        self._one("add_all", key, ns, values=list(values))

    def update(self, key: Any, values: list[Any], ns: str = "") -> None:
        self._one("put", key, ns, value=list(values))

    def get_many(self, keys: Any, ns: Any = "", *, as_arrow: bool = False) -> Any:
        """Every key's list (``None`` where absent), as a Series of lists or an Arrow list array."""
        return self._job.columns().get(self.name, keys, ns, as_arrow=as_arrow)

    def put_many(self, keys: Any, values: Any, ns: Any = "") -> int:
        """Replace each key's list with the row's list (a list column)."""
        return self._job.columns().put(self.name, keys, values, ns)

    def add_many(self, keys: Any, values: Any, ns: Any = "") -> int:
        """Append each row's value to its key's list (a list per row: add all of them)."""
        return self._job.columns().add(self.name, keys, values, ns)


class MapStateHandle(StateHandle):
    """A map state (Flink's ``MapState``): per key, entries by ``user_key``, each read, put, folded
    (``add``, with the map's function) or removed on its own; ``entries`` reads them all."""

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

    def get_many(self, keys: Any, user_keys: Any, ns: Any = "", *, as_arrow: bool = False) -> Any:
        """Row ``i``'s entry ``user_keys[i]`` of key ``keys[i]`` (null where absent)."""
        return self._job.columns().map_get(self.name, keys, user_keys, ns, as_arrow=as_arrow)

    def put_many(self, keys: Any, user_keys: Any, values: Any, ns: Any = "") -> int:
        return self._job.columns().map_put(self.name, keys, user_keys, values, ns)

    def add_many(self, keys: Any, user_keys: Any, values: Any, ns: Any = "") -> int:
        """Fold each row's value into its entry with the map's ``function``, on the server."""
        return self._job.columns().map_add(self.name, keys, user_keys, values, ns)

    def remove_many(self, keys: Any, user_keys: Any, ns: Any = "") -> int:
        return self._job.columns().map_remove(self.name, keys, user_keys, ns)

    def entries_many(self, keys: Any, ns: Any = "", *, as_arrow: bool = False) -> Any:
        """Every key's whole map (a dict; ``None`` where absent), or an Arrow map array."""
        return self._job.columns().get(self.name, keys, ns, as_arrow=as_arrow)

    def replace_many(self, keys: Any, maps: Any, ns: Any = "") -> int:
        """Replace each key's whole map with the row's (dicts, or an Arrow map column)."""
        return self._job.columns().put(self.name, keys, maps, ns)


class ReducingStateHandle(StateHandle):
    """Reducing and aggregating state: ``add`` folds into the server-side built-in function."""

    def get(self, key: Any, ns: str = "") -> Any:
        return self._one("get", key, ns)

    def add(self, key: Any, value: Any, ns: str = "") -> None:
        self._one("add", key, ns, value=value)

    def add_all(self, key: Any, values: list[Any], ns: str = "") -> None:
        self._one("add_all", key, ns, values=list(values))

    def get_many(self, keys: Any, ns: Any = "", *, as_arrow: bool = False) -> Any:
        """Every key's reduced or aggregated result (typed by the state's ``value_type``)."""
        return self._job.columns().get(self.name, keys, ns, as_arrow=as_arrow)

    def add_many(self, keys: Any, values: Any, ns: Any = "") -> int:
        """Fold each row's value into its key with the state's function (a scalar: into every key)."""
        return self._job.columns().add(self.name, keys, values, ns)


class AggregatingStateHandle(ReducingStateHandle):
    pass


HANDLES: dict[str, type[StateHandle]] = {
    "value": ValueStateHandle,
    "list": ListStateHandle,
    "map": MapStateHandle,
    "reducing": ReducingStateHandle,
    "aggregating": AggregatingStateHandle,
}
