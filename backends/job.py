"""A job: one namespace of state with a fixed max parallelism, served by this replica for
its key-group range (Flink: one operator's keyed backend on one subtask)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import cached_property
from typing import Any, NamedTuple

from statehouse.backends.base.partition import StorePartition, WriteOp
from statehouse.backends.base.transaction import PartitionTransaction, StagedView, TransactionSource
from statehouse.backends.bounds import MAX_EPOCH, check_range
from statehouse.backends.errors import (
    BatchInFlight,
    JobReplaced,
    StaleEpoch,
    StateNotFound,
    WrongStateKind,
)
from statehouse.backends.keyed import (
    STATE_CLASSES,
    AggregatingState,
    KeyedState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from statehouse.backends.keyspace import KeySpace, first_page, position_of
from statehouse.backends.limits import AnswerMeter, Limits
from statehouse.backends.operator_state import OperatorState
from statehouse.backends.raw_state import RawKeyedState, RawOperatorState
from statehouse.backends.reserved import (
    BROADCAST_TABLE,
    COMMITTED_BATCH_META,
    COMMITTED_EPOCH_META,
    EPOCH_META,
    LIST_TABLE,
    META_TABLE,
    NON_KEYED_TABLES,
    STAGED_OPERATOR_META,
    STATE_META,
)
from statehouse.backends.runs import Run
from statehouse.backends.snapshot.operator_format import OperatorSnapshot, replace_ops
from statehouse.backends.staging import Staging
from statehouse.backends.timers import TimerService
from statehouse.backends.ttl import Clock, SystemClock
from statehouse.backends.ttl_cleanup import IncrementalCleanup
from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.stored.codec import decode_primary
from statehouse.snapshots.stored.descriptors import StateDescriptor


class StoredKey(NamedTuple):
    key_group: int
    key: str | int
    namespace: str
    position: tuple[int, bytes]  # where a listing resumes after this key


def stored_descriptors(partition: StorePartition) -> dict[str, StateDescriptor]:
    """The state descriptors a partition holds (what a job opened on it serves)."""
    found = {}
    for key, value in partition.meta_items():
        if key.startswith(STATE_META):
            descriptor = StateDescriptor.from_dict(json.loads(value))
            found[descriptor.name] = descriptor
    return found


class Job:
    def __init__(
        self,
        name: str,
        partition: StorePartition,
        *,
        replica_index: int = 0,
        replica_count: int = 1,
        clock: Clock | None = None,
        limits: Limits | None = None,
        layout_version: int = 0,
        serving: bool = True,
    ) -> None:
        self.name = name
        self.limits = limits or Limits()
        self.partition = partition
        # Where keys live (key groups, the owned range, stored keys, what a live rescale froze):
        # one value, swapped whole under the lock; a request keeps the one it began with.
        self.keyspace = KeySpace(
            name, partition.max_parallelism, replica_index, replica_count, self.limits, layout_version, serving=serving
        )
        self.clock: Clock = clock or SystemClock()
        partition.create_table(LIST_TABLE, nested=False)
        partition.create_table(BROADCAST_TABLE, nested=True)
        self.descriptors: dict[str, StateDescriptor] = stored_descriptors(partition)
        self.ttl_cleanup = IncrementalCleanup(partition, self.key_group_range)
        # Every write takes this lock; a restore's swap takes it to retire the job, so a write
        # lands either before the swap (and is replaced with the rest) or is refused after it.
        self._lock = threading.RLock()
        self._replaced = False
        # Task attempts' writes under the current epoch, and the timer floors (backends/staging.py).
        self.staging = Staging(name, partition, self._lock)
        # Counts every change to the partition made outside the epoch commit (direct writes,
        # registrations): the staged views of an epoch hold exactly its partition as long as
        # this did not move since the epoch's staging began.
        self.changes = 0

    # -- life: a restore replaces a job by a new one -----------------------------------------

    def _check_live(self) -> None:
        if self._replaced:
            raise JobReplaced(f"job {self.name!r} was restored while this request waited; retry it")

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold off every other write, refusing if the job was retired. Every write runs inside
        (after a swap retired the job it is refused instead of lost), and so does the
        synchronous part of a snapshot (a consistent freeze)."""
        with self._lock:
            self._check_live()
            yield

    @contextmanager
    def held_if_free(self) -> Iterator[bool]:
        """Take the job's lock only if nobody holds it, and say whether it was taken: a caller
        that must not wait (the event loop) runs elsewhere when it was not. Work run inside
        takes the lock again (it is reentrant)."""
        taken = self._lock.acquire(blocking=False)
        try:
            yield taken and self.partition.is_open
        finally:
            if taken:
                self._lock.release()

    def retire(self) -> None:
        """Refuse every later access (``not_ready``: retry); waits for a running write.

        Also drops the TTL cleanup cursors: their iterators would keep the storage open."""
        with self._lock:
            self._replaced = True
            self.staging.drop()
            self.ttl_cleanup.clear()

    def revive(self) -> None:
        """Undo :meth:`retire` (a restore that failed to swap)."""
        with self._lock:
            self._replaced = False

    # -- a live rescale: freeze, switch, drop (docs/rescale.md, "Engine API") ------------------------

    def staged_epochs_in(self, ranges: Sequence[KeyGroupRange]) -> list[int]:
        """The open epochs whose staged writes (an uncommitted micro-batch's) touch these key
        groups: a freeze of them would leave writes that can never commit."""
        with self._lock:
            return self.staging.epochs_touching(ranges)

    def freeze(self, ranges: Sequence[KeyGroupRange], version: int, batch_lease_s: float = 0.0) -> None:
        """Refuse writes into ``ranges`` and to operator state (``rescale_in_progress`` naming
        ``version``) until :meth:`unfreeze` or :meth:`switch_layout`; reads go on. Refused with
        ``batch_in_flight`` (nothing frozen) while an open epoch's staged writes touch them, or a
        micro-batch a coordinator began is in flight (``Staging.in_flight``, within
        ``batch_lease_s``): a move's cut is a micro-batch boundary. Checked under the lock, so no
        staged write or begun batch slips in between. Freezing again replaces."""
        with self.exclusive():
            begun = self.staging.in_flight(batch_lease_s)
            if begun is not None and self.keyspace.frozen_version != version:
                raise BatchInFlight(
                    f"job {self.name!r} is in micro-batch epoch {begun}, begun by its coordinator and not yet "
                    "committed or aborted: the rescale waits for the micro-batch boundary",
                    job=self.name,
                    epochs=[begun],
                )
            epochs = self.staged_epochs_in(ranges)
            if epochs:
                spans = ", ".join(f"{r.start}-{r.end}" for r in ranges)
                raise BatchInFlight(
                    f"job {self.name!r} has staged writes of epoch {epochs[0]} (an uncommitted micro-batch) in key "
                    f"groups {spans}, which the rescale moves; retry once the epoch is committed or aborted",
                    job=self.name,
                    epochs=epochs,
                )
            self.keyspace = replace(self.keyspace, frozen=tuple(ranges), frozen_version=version)

    def unfreeze(self) -> None:
        """Take writes again everywhere this replica owns (a move aborted)."""
        with self._lock:
            self.keyspace = replace(self.keyspace, frozen=(), frozen_version=0)

    def switch_layout(self, count: int, index: int, version: int) -> None:
        """Own replica ``index`` of ``count``'s key groups at topology ``version`` from now on
        (unfrozen): requests that began before finish with the old keyspace (they hold it), later
        ones are located by the new one. The key groups it gains must be loaded first. An index
        past the count (a replica the move removed) owns none."""
        with self._lock:
            keyspace = self.keyspace
            self.keyspace = KeySpace(
                self.name, keyspace.max_parallelism, index, count, self.limits, version, serving=index < count
            )
            # The incremental TTL cleanup walks the owned range: a new one walks the new range.
            self.ttl_cleanup.clear()
            self.ttl_cleanup = IncrementalCleanup(self.partition, self.key_group_range)
            self.changes += 1  # staged views read the partition as it was: a commit replays, not takes them

    def drop_key_groups(self, ranges: Sequence[KeyGroupRange]) -> None:
        """Delete everything stored in these key groups, of every keyed table (states, timers, raw
        keyed streams); never a key group this replica owns. RocksDB deletes each range at once
        (a range tombstone per table), the heap drops its per-key-group dicts: no entry is read.
        RocksDB then compacts those ranges, after the lock is released, to free their space."""
        with self.exclusive():
            owned = self.key_group_range
            for r in ranges:
                if len(r.intersection(owned)):
                    raise ValueError(f"key groups {r.start}-{r.end} of job {self.name!r} overlap its owned {owned}")
            tables = [t for t in self.partition.tables() if t not in NON_KEYED_TABLES]
            ranges = [r for r in ranges if len(r)]
            self.partition.drop_key_groups(tables, ranges)
            self.staging.forget_timer_floors()
            self.changes += 1
        self.partition.reclaim_key_groups(tables, ranges)  # outside the lock: requests go on

    def stage_operator_state(self, operator: OperatorSnapshot | None) -> None:
        """Keep ``operator`` (this replica's operator state under the layout a move goes to) until
        :meth:`apply_staged_operator_state`; durably, in the job's metadata. ``None`` forgets it."""
        with self.exclusive():
            if operator is None:
                self.partition.write([WriteOp("delete", META_TABLE, 0, STAGED_OPERATOR_META)])
            else:
                self.partition.write([WriteOp("put", META_TABLE, 0, STAGED_OPERATOR_META, value=operator.to_bytes())])

    def apply_staged_operator_state(self) -> bool:
        """Replace the job's operator state by the staged one, atomically (a move commits);
        whether one was staged. Applied once: a second call finds nothing staged."""
        with self.exclusive():
            raw = self.partition.get_meta(STAGED_OPERATOR_META)
            if raw is None:
                return False
            staged = OperatorSnapshot.from_bytes(raw)
            current = OperatorSnapshot.from_view(self.partition)
            ops = [*replace_ops(current, staged), WriteOp("delete", META_TABLE, 0, STAGED_OPERATOR_META)]
            self.partition.write(ops)
            self.changes += 1
            return True

    # -- descriptors ---------------------------------------------------------------------

    def register_state(self, descriptor: StateDescriptor, *, loading: bool = False) -> bool:
        """Register a keyed state; ``False`` when an equal-or-compatible one exists.

        A compatible re-registration (e.g. a new TTL duration) replaces the stored descriptor;
        not while a live rescale froze the job (the moved key groups would keep the old one),
        except by the move's own load (``loading``), which registers the snapshot's states.
        """
        with self.exclusive():
            existing = self.descriptors.get(descriptor.name)
            if existing is not None:
                descriptor.check_compatible(existing)
                if existing == descriptor:
                    return False
                if not loading:
                    self.keyspace.check_not_frozen(f"changing state {descriptor.name!r}")
            else:
                self.limits.check_states(self.name, len(self.descriptors) + 1)
            self.partition.create_table(descriptor.name, nested=descriptor.kind == "map")
            tx = PartitionTransaction(self.partition)
            tx.put(META_TABLE, 0, STATE_META + descriptor.name.encode(), json.dumps(descriptor.to_dict()).encode())
            tx.commit()
            self.changes += 1
            self.descriptors[descriptor.name] = descriptor
            return existing is None

    def descriptor(self, name: str) -> StateDescriptor:
        try:
            return self.descriptors[name]
        except KeyError:
            raise StateNotFound(
                f"job {self.name!r} has no state {name!r}; register it first "
                f'(PUT /v1/jobs/{self.name}/states/{name} with {{"kind": ...}})'
            ) from None

    def drop_state(self, name: str) -> None:
        with self.exclusive():
            self.descriptor(name)
            # The checkpoint a live rescale loads from still holds it: dropped here, it would come back.
            self.keyspace.check_not_frozen(f"dropping state {name!r}")
            tx = PartitionTransaction(self.partition)
            tx.delete(META_TABLE, 0, STATE_META + name.encode())
            tx.commit()
            del self.descriptors[name]
            self.ttl_cleanup.forget(name)
            self.partition.drop_table(name)
            self.changes += 1

    # -- writer epochs (fencing) ---------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current writer epoch; writes that name an epoch must name this one."""
        raw = self.partition.get_meta(EPOCH_META)
        return int(raw) if raw is not None else 0

    def fence(self, epoch: int, *, opens_batch: bool = False) -> int:
        """Raise the writer epoch to ``epoch`` (never lower it): writers of older epochs are fenced off.
        ``opens_batch``: a coordinator begins a micro-batch under it (``Staging.in_flight``)."""
        if epoch > MAX_EPOCH and self.epoch == MAX_EPOCH:
            # The ceiling is reached only by a fence naming it (a micro-batch raises the epoch by one).
            raise InvalidArgument(
                f"job {self.name!r}'s writer epoch is at its ceiling {MAX_EPOCH}: no epoch can follow it (writes "
                "under it still work). To fence again, delete the job and restore a checkpoint or savepoint taken "
                "before it was fenced to the ceiling: a snapshot holds the writer epoch it was taken at"
            )
        check_range(epoch, "epoch", MAX_EPOCH)  # an epoch past it could never be named again
        with self.exclusive():
            current = self.epoch
            if epoch > current:
                tx = PartitionTransaction(self.partition)
                tx.put(META_TABLE, 0, EPOCH_META, str(epoch).encode())
                tx.commit()
                current = epoch
                self.staging.drop()  # what older epochs staged can never commit
            if opens_batch:
                self.staging.open_batch(current)
            return current

    @property
    def committed_epoch(self) -> int:
        """The last epoch whose staged writes were committed (0: none); restored with a snapshot."""
        raw = self.partition.get_meta(COMMITTED_EPOCH_META)
        return int(raw) if raw is not None else 0

    @property
    def committed_batch(self) -> int | None:
        """The Spark micro-batch the last committed epoch applied (None: no commit named one): the
        exactly-once anchor, kept with the state, so every snapshot, restore and move carries it."""
        raw = self.partition.get_meta(COMMITTED_BATCH_META)
        return int(raw) if raw is not None else None

    def check_epoch(self, epoch: int) -> None:
        check_range(epoch, "epoch", MAX_EPOCH)
        current = self.epoch
        if epoch != current:
            raise StaleEpoch(
                f"write epoch {epoch} is not the job's current writer epoch {current}: this attempt was fenced off "
                "(or the coordinator has not fenced yet)",
                epoch=current,
            )

    # -- keys: where they live is the keyspace's ---------------------------------------------

    @property
    def max_parallelism(self) -> int:
        return self.keyspace.max_parallelism

    @property
    def replica_index(self) -> int:
        return self.keyspace.replica_index

    @property
    def replica_count(self) -> int:
        return self.keyspace.replica_count

    @property
    def layout_version(self) -> int:
        """The replica's topology version, named in 421s."""
        return self.keyspace.layout_version

    @property
    def key_group_range(self) -> KeyGroupRange:
        return self.keyspace.owned

    def keys(
        self,
        state: str,
        namespace: str | None = "",
        key_group: int | None = None,
        start_after: tuple[int, bytes] | None = None,
    ) -> Iterator[StoredKey]:
        """Every stored (key, namespace) of a state, in key-group then byte order.

        ``namespace=None`` lists all namespaces; ``start_after`` is a previous item's
        ``position`` (for paging). Expired-but-uncleaned entries are included, as in Flink's
        ``getKeys``.
        """
        if key_group is not None:
            self.keyspace.check_key_group(key_group)
        self._check_live()
        descriptor = self.descriptor(state)
        groups = [key_group] if key_group is not None else list(self.key_group_range)
        for kg in groups:
            if start_after is not None and kg < start_after[0]:
                continue
            previous = start_after[1] if start_after is not None and kg == start_after[0] else None
            # Seeks past the previous page (and past each map's entries): a page reads its keys.
            for primary in self.partition.primaries_from(state, kg, previous):
                key, ns = decode_primary(primary, descriptor.key_type)
                if namespace is None or ns == namespace:
                    yield StoredKey(kg, key, ns, (kg, primary))

    def keys_page(
        self, state: str, namespace: str | None, key_group: int | None, after: bytes | None, limit: int
    ) -> tuple[list[StoredKey], bytes | None]:
        """One page of :meth:`keys`: up to ``limit`` after the position ``after`` (a previous
        page's), and where the next page starts (``None``: the last page)."""
        with self.exclusive():  # the iteration seeks in the live partition: no write in between
            return first_page(self.keys(state, namespace, key_group, position_of(after)), limit, _position)

    # -- transactions --------------------------------------------------------------------

    @contextmanager
    def transaction(
        self, epoch: int | None = None, source: TransactionSource | None = None
    ) -> Iterator[JobTransaction]:
        """All operations inside commit together, or (on an exception) not at all.

        With ``epoch``, the writer must hold the job's current writer epoch; checked under the
        write lock, so a fence cannot slip between the check and the writes. ``source`` is what
        the transaction reads and commits to: the job's partition, or an attempt's staged view."""
        with self.exclusive():
            if epoch is not None:
                self.check_epoch(epoch)
            tx = JobTransaction(self, source)
            try:
                yield tx
            except BaseException:
                tx.rollback()
                raise
            if tx.commit() and source is None:
                self.changes += 1

    def close(self) -> None:
        self.staging.drop()
        self.ttl_cleanup.clear()
        self.partition.close()


def _position(key: StoredKey) -> tuple[int, bytes]:
    return key.position


class JobTransaction:
    """Typed access to a job's states inside one transaction."""

    def __init__(self, job: Job, source: TransactionSource | None = None) -> None:
        self.job = job
        # Checked against the keyspace it began with: a live rescale's frozen key groups.
        self._tx = PartitionTransaction(source if source is not None else job.partition, job.keyspace.write_guard())
        self._states: dict[str, KeyedState] = {}
        self.answer = AnswerMeter(job.limits.max_answer_bytes)  # what this request's reads answer
        self.operator = OperatorState(self._tx, job.limits, self.answer)
        self.written: list[Run] = []  # the runs applied that write (``runs.apply_run``), in order

    @cached_property
    def timers(self) -> TimerService:
        """The job's timers in this transaction (made on first use: most transactions have none)."""
        return TimerService(self.job, self._tx)

    @cached_property
    def raw_keyed(self) -> RawKeyedState:
        """The job's raw keyed streams in this transaction (``backends/raw_state.py``)."""
        return RawKeyedState(self.job, self._tx, self.job.limits, self.answer)

    @cached_property
    def raw_operator(self) -> RawOperatorState:
        return RawOperatorState(self._tx, self.job.limits, self.answer)

    def state(self, name: str) -> KeyedState:
        state = self._states.get(name)
        if state is None:
            descriptor = self.job.descriptor(name)
            state = self._states[name] = STATE_CLASSES[descriptor.kind](self.job, self._tx, descriptor, self.answer)
        return state

    def _typed(self, name: str, *kinds: str) -> Any:
        state = self.state(name)
        if state.descriptor.kind not in kinds:
            raise WrongStateKind(
                f"state {name!r} is a {state.descriptor.kind} state; this operation needs a {' or '.join(kinds)} state"
            )
        return state

    def value(self, name: str) -> ValueState:
        return self._typed(name, "value")

    def list(self, name: str) -> ListState:
        return self._typed(name, "list")

    def map(self, name: str) -> MapState:
        return self._typed(name, "map")

    def reducing(self, name: str) -> ReducingState:
        return self._typed(name, "reducing")

    def aggregating(self, name: str) -> AggregatingState:
        return self._typed(name, "aggregating")

    def apply_views(self, views: Iterable[StagedView]) -> None:
        """Take the changes staged attempts' views hold (see ``attempts.commit``)."""
        for view in views:
            self._tx.write_changes(*view.changes())

    def record_commit(self, epoch: int, batch: int | None = None) -> None:
        """Commit with this transaction: the staged writes of ``epoch`` (micro-batch ``batch``) are in it."""
        self._tx.put(META_TABLE, 0, COMMITTED_EPOCH_META, str(epoch).encode())
        if batch is not None:
            self._tx.put(META_TABLE, 0, COMMITTED_BATCH_META, str(batch).encode())

    def commit(self) -> bool:
        """Write the transaction's changes; whether there were any."""
        return self._tx.commit()

    def rollback(self) -> None:
        self._tx.rollback()
        self.answer.used = 0  # what was read is dropped with the writes (a batch re-run op by op)
        self.written = []
