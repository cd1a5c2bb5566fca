"""What a live rescale does to one job on this replica besides its reads and writes
(docs/rescale.md, "Engine API"): freeze the key groups moving out, switch to the new layout,
drop what moved away, and keep the operator state the move commits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from statehouse.backends.base.partition import StorePartition, WriteOp
from statehouse.backends.errors import BatchInFlight
from statehouse.backends.keyspace import KeySpace
from statehouse.backends.limits import Limits
from statehouse.backends.reserved import META_TABLE, NON_KEYED_TABLES, STAGED_OPERATOR_META
from statehouse.backends.snapshot.operator_format import OperatorSnapshot, replace_ops
from statehouse.backends.staging import Staging
from statehouse.protocol.keygroups import KeyGroupRange


class MoveState:
    """A job's part in a live rescale: which keyspace each step of the move leads to, the
    key groups it drops, and the operator state staged for its commit.

    The job holds its :class:`KeySpace` (an immutable value every request keeps for its whole
    run); this class computes the next one (frozen, unfrozen, switched) and refuses a freeze
    that would cut a micro-batch, and the job swaps the value in under its lock. The staged
    operator state is kept durably in the job's metadata, so a replica restarted between the
    move's load and its commit still has it. The caller holds the job's lock."""

    def __init__(self, job: str, partition: StorePartition, staging: Staging, limits: Limits) -> None:
        self.job = job  # the job's name, for errors and new keyspaces
        self.partition = partition
        self.staging = staging
        self.limits = limits

    def staged_epochs_in(self, ranges: Sequence[KeyGroupRange]) -> list[int]:
        """The open epochs whose staged writes (an uncommitted micro-batch's) touch these key
        groups: a freeze of them would leave writes that can never commit."""
        return self.staging.epochs_touching(ranges)

    def frozen(
        self, keyspace: KeySpace, ranges: Sequence[KeyGroupRange], version: int, batch_lease_s: float
    ) -> KeySpace:
        """``keyspace`` with ``ranges`` frozen for the move to topology ``version``; refused with
        ``batch_in_flight`` while an open epoch's staged writes touch them, or a micro-batch a
        coordinator began is in flight (within ``batch_lease_s``): a move's cut is a micro-batch
        boundary. A freeze for the same version again replaces the frozen ranges."""
        begun = self.staging.in_flight(batch_lease_s)
        if begun is not None and keyspace.frozen_version != version:
            raise BatchInFlight(
                f"job {self.job!r} is in micro-batch epoch {begun}, begun by its coordinator and not yet "
                "committed or aborted: the rescale waits for the micro-batch boundary",
                job=self.job,
                epochs=[begun],
            )
        epochs = self.staged_epochs_in(ranges)
        if epochs:
            spans = ", ".join(f"{r.start}-{r.end}" for r in ranges)
            raise BatchInFlight(
                f"job {self.job!r} has staged writes of epoch {epochs[0]} (an uncommitted micro-batch) in key "
                f"groups {spans}, which the rescale moves; retry once the epoch is committed or aborted",
                job=self.job,
                epochs=epochs,
            )
        return replace(keyspace, frozen=tuple(ranges), frozen_version=version)

    @staticmethod
    def unfrozen(keyspace: KeySpace) -> KeySpace:
        """``keyspace`` taking writes again everywhere it owns (a move aborted)."""
        return replace(keyspace, frozen=(), frozen_version=0)

    def switched(self, keyspace: KeySpace, count: int, index: int, version: int) -> KeySpace:
        """The keyspace of replica ``index`` of ``count`` at topology ``version``, unfrozen; an
        index past the count (a replica the move removed) owns no key group."""
        return KeySpace(self.job, keyspace.max_parallelism, index, count, self.limits, version, serving=index < count)

    def drop_key_groups(
        self, ranges: Sequence[KeyGroupRange], owned: KeyGroupRange
    ) -> tuple[list[str], list[KeyGroupRange]]:
        """Delete everything stored in ``ranges`` (never in ``owned``), of every keyed table;
        the tables and the non-empty ranges dropped, which the caller reclaims after it releases
        the job's lock (:meth:`StorePartition.reclaim_key_groups`)."""
        for r in ranges:
            if len(r.intersection(owned)):
                raise ValueError(f"key groups {r.start}-{r.end} of job {self.job!r} overlap its owned {owned}")
        tables = [t for t in self.partition.tables() if t not in NON_KEYED_TABLES]
        ranges = [r for r in ranges if len(r)]
        self.partition.drop_key_groups(tables, ranges)
        self.staging.forget_timer_floors()
        return tables, ranges

    def stage_operator_state(self, operator: OperatorSnapshot | None) -> None:
        """Keep ``operator`` in the job's metadata until :meth:`apply_staged_operator_state`;
        ``None`` forgets it."""
        if operator is None:
            self.partition.write([WriteOp("delete", META_TABLE, 0, STAGED_OPERATOR_META)])
        else:
            self.partition.write([WriteOp("put", META_TABLE, 0, STAGED_OPERATOR_META, value=operator.to_bytes())])

    def apply_staged_operator_state(self) -> bool:
        """Replace the job's operator state by the staged one in one write, and forget the staged
        one; whether one was staged."""
        raw = self.partition.get_meta(STAGED_OPERATOR_META)
        if raw is None:
            return False
        staged = OperatorSnapshot.from_bytes(raw)
        current = OperatorSnapshot.from_view(self.partition)
        self.partition.write([*replace_ops(current, staged), WriteOp("delete", META_TABLE, 0, STAGED_OPERATOR_META)])
        return True
