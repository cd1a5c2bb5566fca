"""The ``statehouse`` data source and its reader: a keyed state as a DataFrame, read from the live
replicas through their scan endpoint (``GET /v1/jobs/{job}/states/{state}/scan``, Arrow pages).

One input partition per replica and key-group sub-range; each reads its pages one after the other
(bounded by the server), so no task holds more than a page. Filters on ``key`` (``=``, ``IN``)
become point reads on the keys' owners; filters on ``key_group`` narrow the partitions."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from statehouse.client.client import StatehouseClient
from statehouse.client.datasource.filters import PAGE_ROWS, KeyFilterPushdown, key_groups_of, split_range
from statehouse.client.datasource.operator import OPERATOR_SCHEMA, broadcast_rows, list_rows
from statehouse.client.datasource.options import (
    STREAM_WRITE_OPTIONS,
    WRITE_OPTIONS,
    ReadMode,
    SourceError,
    SourceOptions,
    check_known,
    default_partitions,
    read_mode,
    refusal,
)
from statehouse.client.errors import StatehouseError
from statehouse.client.paging import follow, listing
from statehouse.client.transport import ReplicaConnection
from statehouse.protocol import routes
from statehouse.protocol.keygroups import KeyGroupRange, operator_index
from statehouse.protocol.routes import MAX_SCAN_KEYS, NEXT_CURSOR

# A write applies its rows on top of what the state holds (one epoch); replacing the state would be
# a clear of every key in that same epoch, which the write protocol has no step for.
OVERWRITE_REFUSED = (
    "mode('overwrite') would replace the state, which a write does not do: it applies its rows to what the "
    "state holds, as one epoch. Use mode('append'); to start over, first write op 'clear' with the keys a read "
    "returns, or drop the state (DELETE /v1/jobs/{job}/states/{state} on every replica) and register it again"
)


@dataclass(frozen=True)
class StateLayout:
    """What the driver learns of the job once: enough to plan partitions and route keys."""

    max_parallelism: int
    urls: tuple[str, ...]  # urls[i] is replica i, as the client learned them
    key_type: str
    schema: pa.Schema

    @property
    def replica_count(self) -> int:
        return len(self.urls)


def connect(options: SourceOptions, url: str) -> ReplicaConnection:
    config = options.config
    return ReplicaConnection(
        url, token=config.token, timeout=config.timeout, retries=config.retries, backoff=config.backoff
    )


def scan_path(options: SourceOptions) -> str:
    return routes.path(routes.STATE_SCAN, job=options.job, state=options.state)


def read_pages(connection: ReplicaConnection, path: str, params: dict[str, Any]) -> Iterator[pa.Table]:
    """Every page of one scan, following its cursor; the pages without their metadata."""

    def fetch(cursor: str | None) -> pa.Table:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        answer = connection.request("GET", path, idempotent=True, params=query)
        return pa.ipc.open_stream(answer.content).read_all()

    def next_cursor(table: pa.Table) -> str | None:
        following = (table.schema.metadata or {}).get(NEXT_CURSOR)
        return None if following is None else following.decode()

    for table in follow(fetch, next_cursor):
        yield table.replace_schema_metadata(None)


TIMERS_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string()),  # int and long keys in decimal: one domain holds every key type
        pa.field("key_type", pa.string()),
        pa.field("ns", pa.string()),
        pa.field("timestamp", pa.int64()),
        pa.field("key_group", pa.int32()),
    ]
)
STATES_SCHEMA = pa.schema(
    [
        pa.field("state", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("key_type", pa.string()),
        pa.field("value_type", pa.string()),
        pa.field("function", pa.string()),
        pa.field("ttl_ms", pa.int64()),
        pa.field("replica", pa.int32()),
        pa.field("key_group", pa.int32()),  # null: the state holds nothing on this replica
        pa.field("entries", pa.int64()),
        pa.field("bytes", pa.int64()),
    ]
)


# The schema of each live read but a keyed state's (whose the state's stored values decide).
VIEW_SCHEMAS = {ReadMode.TIMERS: TIMERS_SCHEMA, ReadMode.STATES: STATES_SCHEMA, ReadMode.OPERATOR: OPERATOR_SCHEMA}


def describe(options: SourceOptions, mode: ReadMode = ReadMode.KEYED) -> StateLayout:
    """The job's layout and the read's Arrow schema (a keyed state's: a one-row page of replica 0 has it)."""
    try:
        with StatehouseClient(options.config) as client:
            job = client.job(options.job)
            view = VIEW_SCHEMAS.get(mode)
            if view is not None:
                return StateLayout(job.max_parallelism, tuple(client.replicas.urls), "string", view)
            key_type = job.key_type(options.state)
            connection = client.replicas[0]
            page = next(read_pages(connection, scan_path(options), {"limit": 1}))
            return StateLayout(job.max_parallelism, tuple(client.replicas.urls), key_type, page.schema)
    except StatehouseError as exc:
        raise refusal(exc, f"reading state {options.state!r} of job {options.job!r}") from None


class StatehouseDataSource(DataSource):
    """``spark.dataSource.register(StatehouseDataSource)``, then ``format("statehouse")`` with the
    options ``urls``, ``job``, ``state`` (and ``op`` to write). See docs/spark.md. A read's options
    name one of six reads (:class:`ReadMode`), decided once here; each has its reader."""

    @functools.cached_property
    def mode(self) -> ReadMode:
        """The read the options name, decided at the first question (PySpark's ``DataSource.__init__``
        is not to be overridden)."""
        return read_mode(self.options)

    @classmethod
    def name(cls) -> str:
        return "statehouse"

    # The session's default parallelism, which register() records: a read that does not say
    # how many input partitions to make makes enough for it.
    parallelism: int | None = None

    def _checkpoint(self, splits: int = 1) -> Any:
        """A checkpoint read's options (the mode is one)."""
        try:
            from statehouse.client.datasource.checkpoint import CheckpointOptions
        except ImportError as exc:
            raise SourceError(
                "reading a checkpoint needs the client's checkpoint extra "
                f"(pip install 'statehouse-client[checkpoint]'): {exc}"
            ) from None
        return CheckpointOptions.parse(self.options, splits=splits)

    def _layout(self) -> StateLayout:
        layout = getattr(self, "_known", None)
        if layout is None:
            layout = self._known = describe(SourceOptions.parse(self.options), self.mode)
        return layout

    def _stored(self, checkpoint: Any) -> tuple[list[Any], Any]:
        """A checkpoint's parts and, for a keyed read, the state's descriptor it recorded (read once)."""
        known = getattr(self, "_snapshot", None)
        if known is None:
            from statehouse.client.datasource.checkpoint import snapshot_parts, stored_descriptor

            parts = snapshot_parts(checkpoint)
            keyed = self.mode is ReadMode.CHECKPOINT_KEYED
            known = self._snapshot = (parts, stored_descriptor(checkpoint, parts) if keyed else None)
        return known

    def schema(self) -> StructType:
        if self.mode is ReadMode.CHECKPOINT_KEYED:
            from statehouse.snapshots.stored.arrow import schema

            return from_arrow_schema(schema(self._stored(self._checkpoint())[1]))
        if self.mode is ReadMode.CHECKPOINT_OPERATOR:
            self._checkpoint()  # its options are checked when Spark asks for the schema, as a keyed read's
            return from_arrow_schema(OPERATOR_SCHEMA)
        return from_arrow_schema(self._layout().schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.mode.from_checkpoint:
            from statehouse.client.datasource.checkpoint import CheckpointKeyedReader, CheckpointOperatorReader

            parts, descriptor = self._stored(self._checkpoint())
            checkpoint = self._checkpoint(default_partitions(self.parallelism, len(parts)))
            if self.mode is ReadMode.CHECKPOINT_KEYED:
                return CheckpointKeyedReader(checkpoint, parts, descriptor)
            return CheckpointOperatorReader(checkpoint, parts)
        layout = self._layout()
        splits = default_partitions(self.parallelism, layout.replica_count)
        return LIVE_READERS[self.mode](SourceOptions.parse(self.options, splits=splits), layout)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from statehouse.client.datasource.writer import BatchWriter

        options = SourceOptions.parse(self.options, writing=True)
        check_known(self.options, WRITE_OPTIONS, "a write")
        if overwrite:
            raise SourceError(OVERWRITE_REFUSED)
        return BatchWriter(options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from statehouse.client.datasource.writer import StreamWriter

        options = SourceOptions.parse(self.options, writing=True)
        check_known(self.options, STREAM_WRITE_OPTIONS, "a streaming write")
        if overwrite:  # outputMode("complete")
            raise SourceError(OVERWRITE_REFUSED)
        return StreamWriter(options, schema)


class ScanPartition(InputPartition):
    """Replica ``replica``'s key groups ``start``..``end``; with ``keys``, only those keys' rows."""

    def __init__(self, replica: int, start: int, end: int, keys: list[Any] | None = None) -> None:
        super().__init__((replica, start, end))
        self.replica, self.start, self.end, self.keys = replica, start, end, keys


class StatehouseReader(KeyFilterPushdown, DataSourceReader):
    """A keyed state's rows from the live replicas: one input partition per replica and key-group
    sub-range (``partitions_per_replica``), each paging through its replica's scan; with key
    filters pushed down, one partition per owner of the keys, reading only them."""

    def __init__(self, options: SourceOptions, layout: StateLayout) -> None:
        self.options, self.layout = options, layout
        self.first, self.last = 0, layout.max_parallelism - 1  # the key groups filters leave
        self.keys: set[Any] | None = None  # the keys filters leave (None: every key)

    def partitions(self) -> Sequence[InputPartition]:
        found = self._partitions()
        self._preflight({p.replica for p in found if isinstance(p, ScanPartition) and p.start <= p.end})
        return found

    def _preflight(self, replicas: set[int]) -> None:
        """Ask each replica the plan reads for the state's descriptor, on the driver when Spark plans
        the query: a replica down or a state dropped since ``load()`` is then one error saying what to
        fix, not a task's (Spark puts its own line before a task's error, and retries the task)."""
        path = routes.path(routes.STATE, job=self.options.job, state=self.options.state)
        for replica in sorted(replicas):
            connection = connect(self.options, self.layout.urls[replica])
            try:
                connection.request("GET", path, idempotent=True)
            except StatehouseError as exc:
                raise refusal(exc, f"reading state {self.options.state!r} from {connection.url}") from None
            finally:
                connection.close()

    def _partitions(self) -> list[InputPartition]:
        layout = self.layout
        if self.keys is not None:
            return self._key_partitions(sorted(self.keys, key=repr))
        found: list[InputPartition] = []
        for replica in range(layout.replica_count):
            owned = KeyGroupRange.for_operator(layout.max_parallelism, layout.replica_count, replica)
            start, end = max(owned.start, self.first), min(owned.end, self.last)
            if start > end:
                continue
            for low, high in split_range(start, end, self.options.partitions_per_replica):
                found.append(ScanPartition(replica, low, high))
        return found or [ScanPartition(0, 0, -1, [])]

    def _key_partitions(self, keys: list[Any]) -> list[InputPartition]:
        """One partition per owner of the keys (those in the key-group range filters leave)."""
        layout = self.layout
        by_owner: dict[int, list[Any]] = {}
        grouped_keys = key_groups_of(keys, layout.key_type, layout.max_parallelism, self.first, self.last)
        for group, grouped in grouped_keys.items():
            owner = operator_index(layout.max_parallelism, layout.replica_count, group)
            by_owner.setdefault(owner, []).extend(grouped)
        found: list[InputPartition] = [
            ScanPartition(owner, self.first, self.last, owned) for owner, owned in sorted(by_owner.items())
        ]
        return found or [ScanPartition(0, 0, -1, [])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ScanPartition)
        if partition.start > partition.end:
            return
        connection = connect(self.options, self.layout.urls[partition.replica])
        owned = KeyGroupRange.for_operator(self.layout.max_parallelism, self.layout.replica_count, partition.replica)
        base = {
            "key_group_start": max(partition.start, owned.start),
            "key_group_end": min(partition.end, owned.end),
            "limit": PAGE_ROWS,
        }
        requests = (
            [base]
            if partition.keys is None
            else [
                {**base, "key": [str(k) for k in partition.keys[i : i + MAX_SCAN_KEYS]]}
                for i in range(0, len(partition.keys), MAX_SCAN_KEYS)
            ]
        )
        try:
            for params in requests:
                for page in read_pages(connection, scan_path(self.options), params):
                    yield from page.to_batches()
        except StatehouseError as exc:
            raise refusal(exc, f"reading state {self.options.state!r} from {connection.url}") from None
        finally:
            connection.close()


def listing_pages(connection: ReplicaConnection, path: str) -> Iterator[list[dict[str, Any]]]:
    """The non-empty pages of a paged JSON listing (``items``, ``next_cursor``)."""
    for page in listing(connection, path):
        if page["items"]:
            yield page["items"]


class PerReplicaReader(DataSourceReader):
    """A reader with one input partition per replica (``partition.value`` is its index)."""

    def __init__(self, options: SourceOptions, layout: StateLayout) -> None:
        self.options, self.layout = options, layout

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(replica) for replica in range(self.layout.replica_count)]


class TimerReader(PerReplicaReader):
    """``option("timers", domain)``: the domain's timers, one partition per replica (its listing)."""

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        url = self.layout.urls[partition.value]
        connection = connect(self.options, url)
        path = routes.path(routes.TIMERS, job=self.options.job, domain=self.options.timers)
        try:
            for items in listing_pages(connection, path):
                columns = {name: [item[name] for item in items] for name in TIMERS_SCHEMA.names}
                columns["key"] = [str(k) for k in columns["key"]]
                yield pa.RecordBatch.from_pydict(columns, schema=TIMERS_SCHEMA)
        except StatehouseError as exc:
            raise refusal(
                exc, f"reading the {self.options.timers} timers of job {self.options.job!r} from {url}"
            ) from None
        finally:
            connection.close()


class StatesReader(PerReplicaReader):
    """``option("what", "states")``: every state's descriptor and what it stores per key group,
    one partition per replica (its key groups)."""

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        replica: int = partition.value
        url = self.layout.urls[replica]
        connection = connect(self.options, url)
        job = self.options.job
        try:
            for states in listing_pages(connection, routes.path(routes.STATES, job=job)):
                rows: list[dict[str, Any]] = []
                for state in states:
                    ttl = state.get("ttl") or {}
                    described = {
                        "state": state["name"],
                        "kind": state["kind"],
                        "key_type": state["key_type"],
                        "value_type": state.get("value_type"),
                        "function": state.get("function"),
                        "ttl_ms": ttl.get("ttl_ms"),
                        "replica": replica,
                    }
                    sizes = routes.path(routes.STATE_SIZES, job=job, state=state["name"])
                    answer = connection.request("GET", sizes, idempotent=True)
                    groups = json.loads(answer.content)["key_groups"]
                    rows += [
                        {**described, **group} for group in groups or [{"key_group": None, "entries": 0, "bytes": 0}]
                    ]
                yield pa.RecordBatch.from_pylist(rows, schema=STATES_SCHEMA)
        except StatehouseError as exc:
            raise refusal(exc, f"reading the states of job {self.options.job!r} from {url}") from None
        finally:
            connection.close()


class OperatorReader(PerReplicaReader):
    """``option("operator", name)``: the operator's list states (one row per element) and broadcast
    states (one row per entry), one partition per replica: each reads the subtasks it holds
    (subtask ``i`` lives on replica ``i % replicas``), and replica 0 the broadcast states, which
    are the same on every replica (Flink's)."""

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        replica: int = partition.value
        url = self.layout.urls[replica]
        connection = connect(self.options, url)
        job, operator = self.options.job, self.options.operator
        wanted = self.options.state or None
        try:
            described = connection.json("GET", routes.path(routes.OPERATOR, job=job, operator=operator))
            for listed in described["lists"]:
                if wanted not in (None, listed["name"]):
                    continue
                for subtask in listed["subtasks"]:
                    path = routes.path(
                        routes.OPERATOR_LIST, job=job, operator=operator, index=subtask, name=listed["name"]
                    )
                    values = self._list(connection, path)
                    if values:
                        yield list_rows(listed["name"], listed["mode"], subtask, values)
            if replica != 0:
                return
            for name in described["broadcast"]:
                if wanted not in (None, name):
                    continue
                entries = routes.path(routes.BROADCAST_ENTRIES, job=job, operator=operator, name=name)
                for items in listing_pages(connection, entries):
                    yield broadcast_rows(name, [(item["key"], item["value"]) for item in items])
        except StatehouseError as exc:
            raise refusal(
                exc, f"reading operator {self.options.operator!r} of job {self.options.job!r} from {url}"
            ) from None
        finally:
            connection.close()

    @staticmethod
    def _list(connection: ReplicaConnection, path: str) -> list[Any]:
        try:
            return connection.json("GET", path)["value"]
        except StatehouseError as exc:
            if exc.code == "key_not_found":  # emptied since it was listed
                return []
            raise


# The reader of each live read.
LIVE_READERS: dict[ReadMode, Callable[[SourceOptions, StateLayout], DataSourceReader]] = {
    ReadMode.KEYED: StatehouseReader,
    ReadMode.TIMERS: TimerReader,
    ReadMode.STATES: StatesReader,
    ReadMode.OPERATOR: OperatorReader,
}

__all__ = ["SourceError", "StatehouseDataSource"]
