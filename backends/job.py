"""A job: one namespace of state with a fixed max parallelism, served by this replica for
its key-group range (Flink: one operator's keyed backend on one subtask).

:class:`Job` is the facade; its parts each own one concern (``job_life.py``, ``writer_epochs.py``,
``state_registry.py``, ``move_state.py``, ``staging.py``). :class:`JobTransaction` is the typed
access to the job's states inside one transaction."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import cached_property, partial
from itertools import groupby
from operator import itemgetter
from typing import Any, NamedTuple

from statehouse.backends.base.partition import StorePartition
from statehouse.backends.base.transaction import PartitionTransaction, StagedView, TransactionSource
from statehouse.backends.change_tracker import Changed, ChangeTracker
from statehouse.backends.errors import WrongStateKind
from statehouse.backends.job_life import JobLife
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
from statehouse.backends.move_state import MoveState
from statehouse.backends.operator_state import OperatorState
from statehouse.backends.raw_state import RawKeyedState, RawOperatorState
from statehouse.backends.reserved import BROADCAST_TABLE, LIST_TABLE
from statehouse.backends.runs import Run
from statehouse.backends.snapshot.operator_format import OperatorSnapshot
from statehouse.backends.staging import Staging
from statehouse.backends.state_registry import StateRegistry, stored_descriptors
from statehouse.backends.timers import TimerService
from statehouse.backends.ttl import Clock, SystemClock
from statehouse.backends.ttl_cleanup import IncrementalCleanup
from statehouse.backends.writer_epochs import WriterEpochs
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.stored.codec import decode_primary
from statehouse.snapshots.stored.descriptors import StateDescriptor

__all__ = ["Job", "JobTransaction", "StoredKey", "stored_descriptors"]


# Keys a pre-copy's delta reads under the job's lock at once (Job.changed).
_CHANGED_SLICE = 4_096


class StoredKey(NamedTuple):
    """A stored (key, namespace) of a state, as :meth:`Job.keys` lists them."""

    key_group: int
    key: str | int
    namespace: str
    position: tuple[int, bytes]  # where a listing resumes after this key


class Job:
    """One job on this replica: the facade every caller (routers, runs, snapshots, restores,
    the live rescale) uses, over one :class:`StorePartition`.

    It owns what ties its parts together: the partition, the current :class:`KeySpace` (where
    keys live; swapped whole, a request keeps the one it began with), the incremental TTL
    cleanup, and ``changes``, which counts every change to the partition made outside an epoch's
    commit (direct writes, registrations): an epoch's staged views hold exactly the partition as
    long as it did not move since the epoch's staging began. The rest is delegated, each to the
    part that owns it:

    * :class:`JobLife` — the write lock and the retirement by a restore's swap;
    * :class:`Staging` — task attempts' writes under the current epoch, and the timer floors;
    * :class:`WriterEpochs` — the writer epoch (fencing) and the last commit's epoch and batch;
    * :class:`StateRegistry` — the state descriptors;
    * :class:`MoveState` — the live rescale's freeze, switch, drop and staged operator state.

    Flink: one operator's keyed backend on one subtask."""

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
        self.states = StateRegistry(name, partition, self.limits)
        self.ttl_cleanup = IncrementalCleanup(partition, self.key_group_range)
        self.life = JobLife(name)
        self._lock = self.life.lock
        # Task attempts' writes under the current epoch, and the timer floors (backends/staging.py).
        self.staging = Staging(name, partition, self._lock)
        self.epochs = WriterEpochs(name, partition, self.staging, self.life)
        self.moves = MoveState(name, partition, self.staging, self.limits)
        self.tracker: ChangeTracker | None = None  # a pre-copy move's record of what changed (track_changes)
        # Counts every change to the partition made outside the epoch commit (direct writes,
        # registrations): the staged views of an epoch hold exactly its partition as long as
        # this did not move since the epoch's staging began.
        self.changes = 0

    # -- life: a restore replaces a job by a new one -----------------------------------------

    def _check_live(self) -> None:
        self.life.check_live()

    def exclusive(self) -> AbstractContextManager[None]:
        """Hold off every other write, refusing if the job was retired. Every write runs inside
        (after a swap retired the job it is refused instead of lost), and so does the
        synchronous part of a snapshot (a consistent freeze)."""
        return self.life.exclusive()

    def held_if_free(self) -> AbstractContextManager[bool]:
        """Take the job's lock only if nobody holds it, and say whether it was taken: a caller
        that must not wait (the event loop) runs elsewhere when it was not. Work run inside
        takes the lock again (it is reentrant)."""
        return self.life.held_if_free(lambda: self.partition.is_open)

    def retire(self) -> None:
        """Refuse every later access (``not_ready``: retry); waits for a running write.

        Also drops the TTL cleanup cursors: their iterators would keep the storage open."""
        with self._lock:
            self.life.retired = True
            self.staging.drop()
            self.ttl_cleanup.clear()

    def revive(self) -> None:
        """Undo :meth:`retire` (a restore that failed to swap)."""
        with self._lock:
            self.life.retired = False

    # -- a live rescale: freeze, switch, drop (docs/rescale.md, "Engine API") ------------------------

    def staged_epochs_in(self, ranges: Sequence[KeyGroupRange]) -> list[int]:
        """The open epochs whose staged writes (an uncommitted micro-batch's) touch these key
        groups: a freeze of them would leave writes that can never commit."""
        with self._lock:
            return self.moves.staged_epochs_in(ranges)

    def freeze(self, ranges: Sequence[KeyGroupRange], version: int, batch_lease_s: float = 0.0) -> None:
        """Refuse writes into ``ranges`` and to operator state (``rescale_in_progress`` naming
        ``version``) until :meth:`unfreeze` or :meth:`switch_layout`; reads go on. Refused with
        ``batch_in_flight`` (nothing frozen) while an open epoch's staged writes touch them, or a
        micro-batch a coordinator began is in flight (``Staging.in_flight``, within
        ``batch_lease_s``): a move's cut is a micro-batch boundary. Checked under the lock, so no
        staged write or begun batch slips in between. Freezing again replaces."""
        with self.exclusive():
            self.keyspace = self.moves.frozen(self.keyspace, ranges, version, batch_lease_s)

    def unfreeze(self) -> None:
        """Take writes again everywhere this replica owns (a move aborted)."""
        with self._lock:
            self.keyspace = self.moves.unfrozen(self.keyspace)

    def switch_layout(self, count: int, index: int, version: int) -> None:
        """Own replica ``index`` of ``count``'s key groups at topology ``version`` from now on
        (unfrozen): requests that began before finish with the old keyspace (they hold it), later
        ones are located by the new one. The key groups it gains must be loaded first. An index
        past the count (a replica the move removed) owns none."""
        with self._lock:
            self.keyspace = self.moves.switched(self.keyspace, count, index, version)
            # The incremental TTL cleanup walks the owned range: a new one walks the new range.
            self.ttl_cleanup.clear()
            self.ttl_cleanup = IncrementalCleanup(self.partition, self.key_group_range)
            self.changes += 1  # staged views read the partition as it was: a commit replays, not takes them

    def drop_key_groups(self, ranges: Sequence[KeyGroupRange], reclaim: bool = True) -> Callable[[], None]:
        """Delete everything stored in these key groups, of every keyed table (states, timers, raw
        keyed streams); never a key group this replica owns. RocksDB deletes each range at once
        (a range tombstone per table), the heap drops its per-key-group dicts: no entry is read.
        RocksDB then compacts those ranges to free their space, after the lock is released; without
        ``reclaim``, when the caller runs the returned call (the deletion holds meanwhile)."""
        with self.exclusive():
            tables, dropped = self.moves.drop_key_groups(ranges, self.key_group_range)
            self.changes += 1
        compact = partial(self.partition.reclaim_key_groups, tables, dropped)
        if reclaim:
            compact()  # outside the lock: requests go on
        return compact

    def track_changes(self, ranges: Sequence[KeyGroupRange], token: str) -> ChangeTracker:
        """Note, from now on, every key written in ``ranges`` (a pre-copy move's key groups moving
        out), under ``token``; the tracker running under the same token is kept. Taken under the
        lock: each later write is noted, each earlier one is in any snapshot begun after."""
        with self.exclusive():
            if self.tracker is None or self.tracker.token != token:
                self.tracker = ChangeTracker(token, ranges)
            return self.tracker

    def stop_tracking(self) -> None:
        with self._lock:
            self.tracker = None

    def invalidate_tracking(self, token: str, reason: str) -> None:
        """The tracker ``token`` cannot give a delta from here on (a round's keys were taken and
        their delta lost): the move loads these key groups whole."""
        with self._lock:
            if self.tracker is not None and self.tracker.token == token:
                self.tracker.invalidate(reason)

    def changed(self, token: str, take_round: bool = False) -> tuple[int, dict[str, bool], list[Changed]] | None:
        """The tracker's round, the keyed tables (name -> nested) and the whole current content of
        every key the tracker ``token`` noted in that round, ``(key group, table, primary,
        [(secondary, value), ...])``, an empty list for a key that holds nothing now; ``None`` when
        no valid tracker of that token runs. At the cut, call it once the key groups are frozen, so
        that it is the content a checkpoint taken meanwhile holds; ``take_round`` (a catch-up, writes
        going on) begins the next round as it takes the keys. Read under the lock a slice of keys at
        a time, so that writes to the other key groups go on in between."""
        with self.exclusive():
            tracker = self.tracker
            if tracker is None or tracker.token != token or not tracker.valid:
                return None
            taken_round = tracker.round
            noted = tracker.take_round() if take_round else tracker.touched
            touched = sorted(noted)  # by table, then in stored order: one multi-get per table
            tables = self.partition.tables()
        changed: list[Changed] = []
        for start in range(0, len(touched), _CHANGED_SLICE):
            with self.exclusive():
                for table, rows in groupby(touched[start : start + _CHANGED_SLICE], key=itemgetter(0)):
                    changed += self._content(table, tables.get(table), list(rows))
        used = {c[1] for c in changed}
        return taken_round, {t: n for t, n in tables.items() if t in used}, changed

    def _content(self, table: str, nested: bool | None, rows: list[tuple[str, int, bytes]]) -> list[Changed]:
        """The whole current content of ``rows`` (``(table, key group, primary)``, all of ``table``);
        a value table's in one multi-get."""
        if nested is None:  # the table is gone: nothing of it is stored
            return [(kg, table, primary, []) for _t, kg, primary in rows]
        if nested:
            return [(kg, table, primary, list(self.partition.items(table, kg, primary))) for _t, kg, primary in rows]
        values = self.partition.get_many(table, [kg for _t, kg, _p in rows], [primary for _t, _kg, primary in rows])
        return [
            (kg, table, primary, [] if value is None else [(b"", value)])
            for (_t, kg, primary), value in zip(rows, values, strict=True)
        ]

    def stage_operator_state(self, operator: OperatorSnapshot | None) -> None:
        """Keep ``operator`` (this replica's operator state under the layout a move goes to) until
        :meth:`apply_staged_operator_state`; durably, in the job's metadata. ``None`` forgets it."""
        with self.exclusive():
            self.moves.stage_operator_state(operator)

    def apply_staged_operator_state(self) -> bool:
        """Replace the job's operator state by the staged one, atomically (a move commits);
        whether one was staged. Applied once: a second call finds nothing staged."""
        with self.exclusive():
            applied = self.moves.apply_staged_operator_state()
            if applied:
                self.changes += 1
            return applied

    # -- descriptors ---------------------------------------------------------------------

    @property
    def descriptors(self) -> dict[str, StateDescriptor]:
        """The job's state descriptors by name (:class:`StateRegistry`'s, not a copy)."""
        return self.states.descriptors

    def register_state(self, descriptor: StateDescriptor, *, loading: bool = False) -> bool:
        """Register a keyed state; ``False`` when an equal-or-compatible one exists.

        A compatible re-registration (e.g. a new TTL duration) replaces the stored descriptor;
        not while a live rescale froze the job (the moved key groups would keep the old one),
        except by the move's own load (``loading``), which registers the snapshot's states.
        """
        with self.exclusive():
            registered = self.states.register(descriptor, self.keyspace, loading=loading)
            if registered != "unchanged":
                self.changes += 1
            return registered == "new"

    def descriptor(self, name: str) -> StateDescriptor:
        """The descriptor of state ``name`` (``state_not_found`` if the job has none)."""
        return self.states.get(name)

    def drop_state(self, name: str) -> None:
        """Forget state ``name`` and delete what it stored."""
        with self.exclusive():
            self.states.unregister(name, self.keyspace)
            if self.tracker is not None:
                self.tracker.invalidate(f"state {name!r} was dropped")
            self.ttl_cleanup.forget(name)
            self.partition.drop_table(name)
            self.changes += 1

    # -- writer epochs (fencing) ---------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current writer epoch; writes that name an epoch must name this one."""
        return self.epochs.current

    def fence(self, epoch: int, *, opens_batch: bool = False) -> int:
        """Raise the writer epoch to ``epoch`` (never lower it): writers of older epochs are fenced off.
        ``opens_batch``: a coordinator begins a micro-batch under it (``Staging.in_flight``)."""
        return self.epochs.fence(epoch, opens_batch=opens_batch)

    @property
    def committed_epoch(self) -> int:
        """The last epoch whose staged writes were committed (0: none); restored with a snapshot."""
        return self.epochs.committed_epoch

    @property
    def committed_batch(self) -> int | None:
        """The Spark micro-batch the last committed epoch applied (None: no commit named one)."""
        return self.epochs.committed_batch

    def check_epoch(self, epoch: int) -> None:
        """Refuse a write naming ``epoch`` unless it is the current writer epoch (``stale_epoch``)."""
        self.epochs.check(epoch)

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
        """Drop what is held in memory for the job and close its partition."""
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
        # A pre-copy move's tracker notes what reaches the partition (a staged view's writes reach it later).
        note = job.tracker.note if source is None and job.tracker is not None else None
        self._tx = PartitionTransaction(
            source if source is not None else job.partition, job.keyspace.write_guard(), note
        )
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
        WriterEpochs.record_commit(self._tx, epoch, batch)

    def commit(self) -> bool:
        """Write the transaction's changes; whether there were any."""
        return self._tx.commit()

    def rollback(self) -> None:
        self._tx.rollback()
        self.answer.used = 0  # what was read is dropped with the writes (a batch re-run op by op)
        self.written = []
