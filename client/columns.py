"""Columnar state: one operation over a whole column of keys, one Arrow request per replica.

``job.columns()`` (or, in a Spark task, ``ctx.columns(job)``) returns :class:`Columns`; the
state handles' ``*_many`` methods use it too::

    cols = job.columns()
    cols.add("spent", df["user_id"], df["amount"])           # one request per replica
    totals = cols.get("spent", df["user_id"])                 # a pandas Series, df's index

Keys, user keys, namespaces and values may be pandas Series or Index, numpy arrays, pyarrow
Arrays or ChunkedArrays, or Python lists (a namespace may also be one string for every row,
a value one scalar for every row). Every row is routed to the replica that owns its key at
once (numpy key groups, bit-for-bit Flink's), the rows of each replica are sent as one Arrow
IPC stream (chunked at ``max_rows`` rows), the replicas in parallel, and reads come back in
the caller's row order.

A call is atomic per request (one replica's rows, up to ``max_rows``), not across replicas
or chunks: as with :class:`~statehouse.client.batch.Batch`, when one part fails the parts not
yet sent are not sent, and the first error is raised. Rows of one key always go to one
replica, in their input order, so duplicate keys apply in row order.

The conversions of inputs and answers are in ``client/arrow.py`` (timers' columns use them
too). Only the columnar modules import numpy, pandas and pyarrow (the ``columnar`` extra):
``import statehouse.client`` stays free of them.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast

import numpy as np
import pandas as pd  # type: ignore[import-untyped]
import pyarrow as pa

from statehouse.client.arrow import (
    chunk_rows,
    ipc_stream,
    key_column,
    namespace_column,
    read_result,
    string_column,
    value_column,
)
from statehouse.client.errors import Conflict, InvalidRequest, StatehouseError
from statehouse.protocol.keygroups import KeyType
from statehouse.protocol.keygroups.columnar import key_groups, operator_indexes
from statehouse.protocol.ops import ANSWERING_COLUMN_OPS, COLUMN_OPS, IDEMPOTENT_OPS, READ_COLUMN_OPS

if TYPE_CHECKING:
    from concurrent.futures import Future

    from statehouse.client.attempts import TaskAttempt
    from statehouse.client.replicas import Replicas, Routed
    from statehouse.client.transport import ReplicaConnection

__all__ = ["COLUMN_OPS", "Columns", "ColumnarJob", "READ_COLUMN_OPS"]


# What one call's rows act on: one state, or several (a tuple) over the same rows.
Target: TypeAlias = "str | tuple[str, ...]"
# A state's value column in a request on several states (the server's ``columns.STATE_VALUE``).
STATE_VALUE = "value:"


class ColumnarJob(Protocol):
    """What :class:`Columns` needs of its job (a :class:`~statehouse.client.job.JobClient`)."""

    replicas: Replicas
    name: str
    max_parallelism: int

    def key_type(self, state: str) -> str: ...

    def refreshed(self) -> bool: ...

    def routing(self) -> Routed: ...

    def reroutes(self, exc: StatehouseError, routed: Routed, url: str | None, attempt: TaskAttempt | None) -> bool: ...


class _NotSent(StatehouseError):
    """A part left unsent because another part of the same call failed."""


@dataclass
class _Part:
    """The rows of one call that one replica owns: ``positions`` in the caller's rows (``None``:
    all of them, in order), and what each of its requests read."""

    replica: int
    positions: np.ndarray | None
    values: list[pa.Array]
    routed: Routed = (None, 0)  # what the rows were routed under (JobClient.routing)
    error: BaseException | None = None


class Columns:
    """Columnar operations of one job: plain, fenced with ``epoch``, or staged for a Spark task
    ``attempt`` (its reads see its writes; each request may be re-sent, and the server applies
    it once). Write methods return the number of rows written; ``read_only`` (a reason) makes
    them raise ``RuntimeError`` (a replayed micro-batch reads only)."""

    def __init__(
        self,
        job: ColumnarJob,
        *,
        attempt: TaskAttempt | None = None,
        epoch: int | None = None,
        max_rows: int | None = None,
        read_only: str | None = None,
    ) -> None:
        self.job = job
        self.attempt = attempt
        self.epoch = attempt.epoch if attempt is not None else epoch
        self.max_rows = max_rows or job.replicas.config.max_columnar_rows
        if self.max_rows < 1:
            raise ValueError(f"max_rows must be positive, got {self.max_rows}")
        self.read_only = read_only

    # -- reads -------------------------------------------------------------------------------

    def get(self, state: str, keys: Any, ns: Any = "", *, as_arrow: bool = False) -> pd.Series | pa.Array:
        """Each key's value (value state), list, whole map, or reduced / aggregated result;
        null (``NaN`` / ``<NA>`` / ``None``) where absent."""
        return self.apply(state, "get", keys, ns=ns, as_arrow=as_arrow)

    def map_get(
        self, state: str, keys: Any, user_keys: Any, ns: Any = "", *, as_arrow: bool = False
    ) -> pd.Series | pa.Array:
        """Each row's map entry ``user_keys[i]`` of key ``keys[i]``."""
        return self.apply(state, "map_get", keys, user_keys=user_keys, ns=ns, as_arrow=as_arrow)

    # -- writes ------------------------------------------------------------------------------

    def put(self, state: str, keys: Any, values: Any, ns: Any = "") -> int:
        """Value state: set (null clears); list state: replace (list values); map state: replace
        the whole map (dict or Arrow map values)."""
        return self.apply(state, "put", keys, values=values, ns=ns)

    def add(self, state: str, keys: Any, values: Any, ns: Any = "") -> int:
        """List state: add one element per row (or a list per row: addAll); reducing and
        aggregating state: fold each value in with the state's function."""
        return self.apply(state, "add", keys, values=values, ns=ns)

    def add_get(
        self, state: str, keys: Any, values: Any, ns: Any = "", *, as_arrow: bool = False
    ) -> pd.Series | pa.Array:
        """Reducing and aggregating state: :meth:`add`, answering each row's result after its add
        (a key that comes back answers its running result), as Redis's INCRBY does: one request
        where an ``add`` and a ``get`` are two. Staged for a task attempt, a result is the
        committed value with this attempt's own adds folded in."""
        return self.apply(state, "add_get", keys, values=values, ns=ns, as_arrow=as_arrow)

    def clear(self, state: str, keys: Any, ns: Any = "") -> int:
        return self.apply(state, "clear", keys, ns=ns)

    def map_put(self, state: str, keys: Any, user_keys: Any, values: Any, ns: Any = "") -> int:
        return self.apply(state, "map_put", keys, user_keys=user_keys, values=values, ns=ns)

    def map_add(self, state: str, keys: Any, user_keys: Any, values: Any, ns: Any = "") -> int:
        """Fold each value into its map entry with the map's ``function``, on the server."""
        return self.apply(state, "map_add", keys, user_keys=user_keys, values=values, ns=ns)

    def map_remove(self, state: str, keys: Any, user_keys: Any, ns: Any = "") -> int:
        return self.apply(state, "map_remove", keys, user_keys=user_keys, ns=ns)

    # -- several states over the same rows: one request per replica ---------------------------

    def get_states(self, states: Sequence[str], keys: Any, ns: Any = "", *, as_arrow: bool = False) -> Any:
        """:meth:`get` of each of ``states`` for the same keys, in one request per replica: a
        ``pandas.DataFrame`` with a column per state (``as_arrow``: a dict of ``pyarrow.Array``)."""
        return self.apply_states("get", tuple(states), keys, ns=ns, as_arrow=as_arrow)

    def add_states(self, values: Mapping[str, Any], keys: Any, ns: Any = "") -> int:
        """:meth:`add` of each state's values (``{state: values}``) for the same keys, in one request
        per replica (one transaction); returns the writes, rows times states."""
        return self.apply_states("add", tuple(values), keys, values=values, ns=ns)

    def add_get_states(self, values: Mapping[str, Any], keys: Any, ns: Any = "", *, as_arrow: bool = False) -> Any:
        """:meth:`add_get` of each state's values (``{state: values}``) for the same keys, in one
        request per replica: the Spark job's sum and count per user, updated and answered by one
        request where it took four. A ``pandas.DataFrame`` with a column per state."""
        return self.apply_states("add_get", tuple(values), keys, values=values, ns=ns, as_arrow=as_arrow)

    def apply_states(
        self,
        op: str,
        states: tuple[str, ...],
        keys: Any,
        *,
        user_keys: Any = None,
        values: Mapping[str, Any] | None = None,
        ns: Any = "",
        as_arrow: bool = False,
    ) -> Any:
        """Run ``op`` on every state of ``states`` for every row (``values``: each state's values);
        the states must share their key type (the rows are routed once)."""
        if not states or len(set(states)) != len(states):
            raise InvalidRequest(f"name each state once, at least one; got {list(states)}")
        key_types = {self.job.key_type(state) for state in states}
        if len(key_types) > 1:
            kinds = ", ".join(sorted(key_types))
            raise InvalidRequest(f"states {', '.join(states)} have different key types ({kinds})")
        return self.apply(states, op, keys, user_keys=user_keys, values=values, ns=ns, as_arrow=as_arrow)

    # -- the core ----------------------------------------------------------------------------

    def apply(
        self,
        state: Target,
        op: str,
        keys: Any,
        *,
        user_keys: Any = None,
        values: Any = None,
        ns: Any = "",
        as_arrow: bool = False,
    ) -> Any:
        """Run ``op`` for every row: a read answers a ``pandas.Series`` (or, ``as_arrow``, a
        ``pyarrow.Array``) in the rows' order, a write the number of rows written. ``state`` a
        tuple (:meth:`apply_states`): ``values`` maps each state to its values, a read answers a
        ``pandas.DataFrame`` (a dict of arrays), a write the rows times the states."""
        if op not in COLUMN_OPS:
            raise InvalidRequest(f"columnar operation must be one of {', '.join(COLUMN_OPS)}; got {op!r}")
        reads = op in ANSWERING_COLUMN_OPS
        if op not in READ_COLUMN_OPS and self.read_only:
            raise RuntimeError(self.read_only)
        maps = op.startswith("map_")
        if maps and user_keys is None:
            raise InvalidRequest(f"'{op}' needs user_keys")
        takes_values = "value" in COLUMN_OPS[op]
        if takes_values and values is None:
            raise InvalidRequest(f"'{op}' needs values (pass a column of nulls to clear with 'put')")
        index = keys.index if isinstance(keys, pd.Series) else None
        key_array = self._keys(_first(state), keys)
        rows = len(key_array)
        columns = {"key": key_array}
        namespace = namespace_column(ns, rows)
        if namespace is not None:
            columns["ns"] = namespace
        if maps:
            columns["user_key"] = string_column(user_keys, "user key", rows)
        if takes_values and isinstance(state, tuple):
            assert isinstance(values, Mapping)  # apply_states passes each state's values
            for name in state:
                columns[STATE_VALUE + name] = value_column(values[name], rows)
        elif takes_values:
            columns["value"] = value_column(values, rows)
        table = pa.Table.from_arrays(list(columns.values()), names=list(columns))
        if rows == 0:
            if not reads:
                return 0
            if isinstance(state, tuple):
                return _by_state(pa.StructArray.from_arrays([pa.nulls(0)] * len(state), names=state), index, as_arrow)
            return read_result(pa.nulls(0), index, state, as_arrow)
        routed = self.job.routing()  # before routing: a layout learned meanwhile re-routes the rows
        parts = self._run(state, op, table, self._route(_first(state), key_array), routed)
        if not reads:
            return rows * (len(state) if isinstance(state, tuple) else 1)
        answered = _assemble(parts, rows, state)
        if isinstance(state, tuple):
            return _by_state(answered, index, as_arrow)
        return read_result(answered, index, state, as_arrow)

    def _keys(self, state: str, keys: Any) -> pa.Array:
        """The keys as the state's key type's Arrow type: utf8, int32 or int64, no nulls."""
        key_type = cast(KeyType, self.job.key_type(state))
        try:
            return key_column(keys, key_type, f"state {state!r} has {key_type} keys")
        except InvalidRequest:
            if not self.job.refreshed():  # the process's key type may be stale: read it again
                raise
        key_type = cast(KeyType, self.job.key_type(state))
        return key_column(keys, key_type, f"state {state!r} has {key_type} keys")

    def _retyped(self, state: Target, rows: pa.Table) -> pa.Table:
        """A chunk's rows with their keys as the (refreshed) key type's Arrow type."""
        return rows.set_column(0, "key", self._keys(_first(state), rows.column("key").combine_chunks()))

    def _route(self, state: str, keys: pa.Array) -> list[np.ndarray | None]:
        """Per replica, the positions of the rows it owns (``None``: every row, in order)."""
        count = len(self.job.replicas)
        if count == 1:  # the only replica owns every key: no need to hash
            return [None]
        key_type = cast(KeyType, self.job.key_type(state))
        owners = operator_indexes(key_groups(keys, key_type, self.job.max_parallelism), self.job.max_parallelism, count)
        sizes = np.bincount(owners, minlength=count)
        if sizes.max() == len(keys):  # one replica owns them all
            return [None if size else np.empty(0, np.int64) for size in sizes]
        # A stable sort of small integers is a radix sort: linear, and keeps the rows' order.
        order = np.argsort(owners.astype(np.int16 if count < (1 << 15) else np.int32), kind="stable")
        bounds = np.concatenate(([0], np.cumsum(sizes)))
        return [order[bounds[r] : bounds[r + 1]] for r in range(count)]

    def _run(
        self, state: Target, op: str, table: pa.Table, routes: list[np.ndarray | None], routed: Routed
    ) -> list[_Part]:
        """Send every replica its rows (``routes``, made under ``routed``), the replicas in
        parallel; raise the first error."""
        parts = [
            _Part(replica, positions, [], routed)
            for replica, positions in enumerate(routes)
            if positions is None or len(positions)
        ]
        failed = threading.Event()
        if len(parts) == 1 and self.attempt is None:
            self._send_part(state, op, table, parts[0], failed)  # one replica to talk to: no thread hop
        else:
            # Each replica's own sender thread: parallel across replicas, and in order with what
            # this client sends that replica otherwise (a task attempt's seq must arrive in order).
            sending: list[Future[None]] = [
                self.job.replicas.send_in_order(part.replica, self._send_part, state, op, table, part, failed)
                for part in parts
            ]
            for future in sending:
                future.result()
        errors = [part.error for part in parts if part.error is not None]
        if errors:
            raise next((e for e in errors if not isinstance(e, _NotSent)), errors[0])
        return parts

    def _send_part(self, state: Target, op: str, table: pa.Table, part: _Part, failed: threading.Event) -> None:
        try:
            rows = table if part.positions is None else table.take(pa.array(part.positions))
            # Several states: every row is a write per state, and the server's row limit counts them.
            step = chunk_rows(rows, max(1, self.max_rows // (len(state) if isinstance(state, tuple) else 1)))
            for start in range(0, rows.num_rows, step):
                if failed.is_set():
                    raise _NotSent("not sent: another part of this columnar call failed")
                chunk = rows.slice(start, step)
                if self.attempt is None and part.routed != self.job.routing():
                    answer = self._rerouted(state, op, chunk)  # routed before the layout or the job was read afresh
                else:
                    located = functools.partial(_at_row, positions=part.positions, start=start)
                    answer = self._deliver(state, op, chunk, part.replica, part.routed, located)
                if answer is not None:
                    part.values.append(answer)
        except BaseException as exc:
            failed.set()
            part.error = exc

    def _deliver(
        self,
        state: Target,
        op: str,
        rows: pa.Table,
        replica: int,
        routed: Routed,
        located: Callable[[StatehouseError], StatehouseError] | None = None,
    ) -> pa.Array | None:
        """One request of ``rows`` to ``replica``, routed under ``routed``. A refusal that a changed
        layout (a rescale) or a job read afresh explains (``JobClient.reroutes``) applied nothing:
        the rows go again, each to its owner as the client routes now (a task attempt's only to
        the same single replica, with the same seq: its epoch spans the old layout). ``located``
        names the caller's row in this request's own refusal."""
        try:
            connection = self.job.replicas[replica]
        except IndexError:  # the layout shrank since the rows were routed
            if self.attempt is not None:
                raise
            return self._rerouted(state, op, rows)
        try:
            return self._request(state, op, rows, replica, connection)
        except StatehouseError as exc:
            if not self.job.reroutes(exc, routed, connection.url, self.attempt):
                if located is None:
                    raise
                raise located(exc) from None
        return self._rerouted(state, op, self._retyped(state, rows))

    def _rerouted(self, state: Target, op: str, rows: pa.Table) -> pa.Array | None:
        """One chunk's rows, each sent to its owner as the client routes now (errors raised); a
        read's values in the chunk's row order."""
        routed = self.job.routing()
        routes = self._route(_first(state), rows.column("key").combine_chunks())
        parts = [_Part(r, p, [], routed) for r, p in enumerate(routes) if p is None or len(p)]
        for part in parts:
            chunk = rows if part.positions is None else rows.take(pa.array(part.positions))
            answer = self._deliver(state, op, chunk, part.replica, part.routed)
            if answer is not None:
                part.values.append(answer)
        return _assemble(parts, rows.num_rows, state) if op in ANSWERING_COLUMN_OPS else None

    def _request(
        self, state: Target, op: str, rows: pa.Table, replica: int, connection: ReplicaConnection
    ) -> pa.Array | None:
        """One request to ``connection``, replica ``replica``: a read's ``value`` column (several
        states': a struct of them, a field per state), or ``None`` for a write."""
        attempt = self.attempt
        if attempt is not None:
            fields, idempotent = attempt.fields(replica), True  # a re-sent seq is answered, not applied again
        else:
            fields = {"epoch": self.epoch} if self.epoch is not None else {}
            idempotent = op in IDEMPOTENT_OPS
        try:
            content = connection.columns(
                self.job.name, state, op, ipc_stream(rows), params=fields, idempotent=idempotent
            )
        except StatehouseError as exc:
            if attempt is not None and 400 <= (exc.status or 0) < 500:
                attempt.refused(replica, fields["seq"])  # answered with an error: nothing staged
            raise
        if op in ANSWERING_COLUMN_OPS:
            states = state if isinstance(state, tuple) else (state,)
            if attempt is not None:  # a read stages nothing; add_get stages a write per row and state
                attempt.answered(replica, 0 if op in READ_COLUMN_OPS else rows.num_rows * len(states))
            answer = pa.ipc.open_stream(content).read_all()
            if not isinstance(state, tuple):
                return answer.column("value").combine_chunks()
            by_state = [answer.column(STATE_VALUE + name).combine_chunks() for name in state]
            return pa.StructArray.from_arrays(by_state, names=list(state))
        if attempt is not None:
            attempt.answered(replica, int(json.loads(content)["rows"]))  # rows are the writes it staged
        return None


def _at_row(exc: StatehouseError, *, positions: np.ndarray | None, start: int) -> StatehouseError:
    """The server names a row of its request (``row`` in the problem): name the caller's row."""
    row = exc.problem.get("row")
    if not isinstance(row, int) or isinstance(row, bool):
        return exc
    original = start + row if positions is None else int(positions[start + row])
    if original == row:
        return exc
    detail = exc.detail
    prefix = f"row {row}"
    detail = f"row {original}{detail[len(prefix) :]}" if detail.startswith(prefix) else f"{detail} (row {original})"
    located = type(exc)(detail, status=exc.status, code=exc.code, problem={**exc.problem, "row": original})
    located.__cause__ = exc.__cause__
    return located


# -- results -----------------------------------------------------------------------------------


def _first(state: Target) -> str:
    """The state whose key type routes the rows (several states share theirs)."""
    return state[0] if isinstance(state, tuple) else state


def _by_state(answered: pa.StructArray, index: pd.Index | None, as_arrow: bool) -> Any:
    """Several states' answers (a struct, a field per state): a DataFrame, or a dict of arrays."""
    names = [answered.type.field(i).name for i in range(answered.type.num_fields)]
    columns = {name: read_result(answered.field(i), index, name, as_arrow) for i, name in enumerate(names)}
    if as_arrow:
        return columns
    frame = pd.DataFrame(columns)
    if index is not None:
        frame.index = index
    return frame


def _assemble(parts: list[_Part], rows: int, state: Target) -> pa.Array:
    """The read values of every part, back in the caller's row order."""
    values = _concat([value for part in parts for value in part.values], state)
    if len(parts) == 1 and parts[0].positions is None:
        return values
    positions = np.concatenate([part.positions for part in parts if part.positions is not None])
    inverse = np.empty(rows, np.int64)
    inverse[positions] = np.arange(rows, dtype=np.int64)  # the scatter: row positions[i] is values[i]
    return values.take(pa.array(inverse))


def _concat(arrays: list[pa.Array], state: Target) -> pa.Array:
    """One array of the parts' answers. An untyped state's replicas may answer different types
    (ints here, floats there; all absent: null): unify them as Arrow would."""
    if len(arrays) == 1:
        return arrays[0]
    kinds = {array.type for array in arrays}
    if len(kinds) > 1:
        known = kinds - {pa.null()}
        if len(known) == 1:
            kind = known.pop()
            arrays = [a if a.type == kind else pa.nulls(len(a), kind) for a in arrays]
        else:
            try:
                tables = [pa.table({"value": a}) for a in arrays]
                unified = pa.concat_tables(tables, promote_options="permissive")
            except (pa.ArrowException, TypeError) as exc:
                raise Conflict(
                    f"the values read from state {state!r} have no one Arrow type ({exc}); register the state "
                    "with a value_type"
                ) from None
            return unified.column("value").combine_chunks()
    return pa.concat_arrays(arrays)
