"""The heap backend's checkpoints as a changelog: a checkpoint writes the keys that changed since
the last completed one, over a full base it shares with the checkpoints before it (Flink's
changelog state backend, materialized: FLIP-158). A full snapshot of a heap state costs its whole
size every checkpoint; a delta costs what changed.

A checkpoint writes a new base instead of a delta when it cannot or should not build on the last
one: no completed checkpoint whose cut the partition's log followed
(:class:`~statehouse.backends.heap.changes.ChangeLog`), or half the state or more changed (a delta
would be as large, and reading it back twice as slow). Otherwise the deltas are kept within a
weight of their bases (so a restore reads at most about twice the state) a slice at a time: a
checkpoint whose deltas would outweigh their bases writes whole, beside its delta, the slices of
key groups whose deltas weigh most against their bases, as many as bring the weight back under.
A micro-batch's checkpoint rewrites a slice or two (an eighth of the state each) now and then,
the whole state only when every slice is due at once.
Savepoints stay in the canonical full format, self-contained.

A changelog is one chain of base and deltas per run of key groups. After a live rescale, the key
groups a replica held keep their chains (the last checkpoint it completed may be of the layout
before), and the ones it took, or any replaced whole, are written whole in the checkpoint's own
stream: the base of a chain of their own. A live rescale's copy may have seeded them (a base
written while writes went on, :meth:`ChangelogSnapshotStrategy.seed`): their chain begins there.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable

from statehouse.backends.base.snapshot import SnapshotSource
from statehouse.backends.errors import JobReplaced
from statehouse.backends.heap.changes import Cut, by_key_group, checkpoint_cut, noted_rows, replaced_whole, union
from statehouse.backends.heap.materialize import SCRATCH_PREFIX, fork_writer, wait_for
from statehouse.backends.heap.partition import HeapPartition
from statehouse.backends.memory import room_for_a_copy
from statehouse.backends.reserved import keyed_tables
from statehouse.backends.snapshot.full_format import delta_records, write_key_groups, write_sections
from statehouse.backends.snapshot.full_strategy import JobStrategy, descriptor_dicts, write_operator_state
from statehouse.backends.snapshot.operator_format import OperatorSnapshot
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.full_format import SnapshotHeader
from statehouse.snapshots.handles import ChangelogChain, ChangelogHandle, KeyGroupsHandle
from statehouse.snapshots.layout import shared_dir
from statehouse.snapshots.metadata import SnapshotFormat, SnapshotPart
from statehouse.snapshots.strategy import AsyncSnapshot, Seed, SeedContext, SnapshotContext, SnapshotResult

log = logging.getLogger(__name__)

BASE_SHARE = 0.5  # a delta of this share of the state's keys or more: a base instead
MAX_DELTAS = 64  # deltas over one base at most: a restore's ranged reads stay few
REWRITES = 2  # rows written since, per key of the state, from which a base is written unmerged
# The deltas' weight, as a multiple of their bases, past which a checkpoint rewrites key groups
# whole: a restore reads at most 1 + this times the state (the settings' heap_changelog_delta_weight).
DELTA_WEIGHT = 1.0
SLICES = 8  # the runs of a job's key groups a checkpoint rewrites whole, each on its own
# Deltas of this share of the weight that makes a base (or chains half as long as allowed): a new
# base is written in the background (:mod:`~statehouse.backends.heap.materialize`), for a later
# checkpoint to chain on instead of writing one inline.
MATERIALIZE_SHARE = 0.5
# Bases smaller than this are written inline: ~100 ms of a checkpoint at most, not worth a fork.
MATERIALIZE_MIN_BYTES = 4 << 20
MATERIALIZE_TIMEOUT_S = 1800.0  # a writer still going after this is killed (a base inline instead)


def _builds_on(previous: SnapshotPart | None, job: SnapshotSource) -> tuple[list[ChangelogChain] | None, str]:
    """The chains of ``previous``, root-relative and restricted to the job's key groups, if a
    delta can follow them (a changelog of the same max parallelism holding some of the job's key
    groups); else why not. ``previous`` may be of the layout before a live rescale: the key groups
    that stayed keep their chains."""
    if previous is None or not isinstance(keyed := previous.metadata.keyed, ChangelogHandle):
        return None, "no completed changelog checkpoint to build on"
    metadata = previous.metadata
    if metadata.max_parallelism != job.max_parallelism:
        return None, f"checkpoint {metadata.checkpoint_id} is of another max parallelism"
    chains = [c for c in (chain.restricted(job.key_group_range) for chain in keyed.chains) if c is not None]
    if not chains:
        return None, f"checkpoint {metadata.checkpoint_id} holds none of the job's key groups here"
    return [chain.under(previous.directory) for chain in chains], ""


def slices(key_groups: KeyGroupRange) -> list[KeyGroupRange]:
    """``key_groups`` cut in ``SLICES`` runs as even as can be (fewer when it has fewer)."""
    count = min(SLICES, len(key_groups))
    bounds = [key_groups.start + len(key_groups) * i // count for i in range(count + 1)]
    return [KeyGroupRange(start, end - 1) for start, end in itertools.pairwise(bounds)]


def rebased(
    kept: list[ChangelogChain], key_groups: KeyGroupRange, changed: dict[int, int], keys: int, delta_weight: float
) -> set[int]:
    """The key groups a checkpoint over ``kept`` writes whole, a slice (:func:`slices`) at a time,
    so that its chains' deltas, its own among them (``changed``: the keys it writes per key group,
    of a state of ``keys`` keys), weigh at most ``delta_weight`` times their bases: any slice whose
    chain has ``MAX_DELTAS`` deltas already, then the slices whose deltas weigh most against their
    bases, as many as it takes."""
    base: dict[int, int] = {}
    deltas: dict[int, int] = {}
    full: set[int] = set()  # key groups whose chain has no room for one more delta
    for chain in kept:
        streams = [h.offsets.sections for h in chain.streams()]
        for kg, first, *rest in zip(chain.key_group_range, *streams, strict=True):
            base[kg], deltas[kg] = first.length, sum(section.length for section in rest)
        if len(chain.deltas) >= MAX_DELTAS:
            full.update(chain.key_group_range)
    per_key = sum(base.values()) / max(1, keys)  # what a changed key's record adds to a delta
    weighed = []  # per slice: its key groups that kept chains hold, their bases' bytes, their deltas' to be
    for run in slices(key_groups):
        held = [kg for kg in run if kg in base]
        weighed.append(
            (held, sum(base[kg] for kg in held), sum(deltas[kg] + per_key * changed.get(kg, 0) for kg in held))
        )
    bound = delta_weight * sum(b for _held, b, _d in weighed)
    total = sum(d for _held, _b, d in weighed)
    # Full chains first, then the heaviest against its base (a slice of no base bytes: last).
    weighed.sort(key=lambda s: (full.isdisjoint(s[0]), -(s[2] / s[1] if s[1] else 0.0)))
    whole: set[int] = set()
    for held, _base, weight in weighed:
        if total <= bound and full.isdisjoint(held):
            break
        whole.update(held)
        total -= weight
    return whole


def _weights(chains: Iterable[ChangelogChain]) -> tuple[int, int]:
    """What a restore of the whole would read: the bases' bytes and the deltas' over them, all
    chains together."""
    bases, deltas = (sum(weights) for weights in zip(*(chain.bytes() for chain in chains), strict=True))
    return bases, deltas


def _let_go(job: SnapshotSource, cut: Cut) -> None:
    """Unpin a seed's cut no checkpoint will take. A job a restore replaced has nothing to unpin:
    its log went with it."""
    partition = job.partition
    assert isinstance(partition, HeapPartition), "the heap store only opens heap partitions"
    if partition.changes is not None:
        with contextlib.suppress(JobReplaced), job.exclusive():
            partition.changes.unpin(cut)


def _seeded(seed: Seed | None, job: SnapshotSource) -> tuple[list[ChangelogChain], Cut | None]:
    """A heap seed's chains within the job's key groups (a live rescale's, of the key groups its
    copy loaded; a materialization's, of them all), and where it cut the partition's log."""
    if seed is None or seed.cut is None:
        return [], None
    return [c for c in (chain.restricted(job.key_group_range) for chain in seed.chains) if c is not None], seed.cut


def _outside(chains: list[ChangelogChain], key_groups: set[int]) -> list[ChangelogChain]:
    """The chains for their key groups that are not in ``key_groups``."""
    return [
        part
        for chain in chains
        for run in _runs(kg for kg in chain.key_group_range if kg not in key_groups)
        if (part := chain.restricted(run)) is not None
    ]


def _runs(key_groups: Iterable[int]) -> list[KeyGroupRange]:
    """Sorted key groups as runs of adjacent ones."""
    runs: list[KeyGroupRange] = []
    for kg in sorted(key_groups):
        if runs and runs[-1].end == kg - 1:
            runs[-1] = KeyGroupRange(runs[-1].start, kg)
        else:
            runs.append(KeyGroupRange(kg, kg))
    return runs


def _chained(kept: list[ChangelogChain], whole: set[int], written: KeyGroupsHandle) -> tuple[ChangelogHandle, int]:
    """The checkpoint's changelog: each kept chain, but for the key groups of ``whole``, with
    ``written`` as its next delta; a chain of ``written`` alone (their base) for each run of
    ``whole``. And the bytes of the kept chains it reuses."""
    chains = [ChangelogChain(h, ()) for run in _runs(whole) if (h := written.restricted(run)) is not None]
    reused = 0
    for chain in kept:
        for run in _runs(kg for kg in chain.key_group_range if kg not in whole):
            part = chain.restricted(run)
            delta = written.restricted(run)
            if part is not None and delta is not None:
                chains.append(ChangelogChain(part.base, (*part.deltas, delta)))
                reused += sum(part.bytes())
    return ChangelogHandle(tuple(sorted(chains, key=lambda c: c.key_group_range.start))), reused


class ChangelogSnapshotStrategy(JobStrategy):
    """A heap job's checkpoint: a delta of the keys changed since the last completed checkpoint
    over that checkpoint's base and deltas, or a new base (see the module)."""

    format: SnapshotFormat = "changelog"
    seeds_taken_key_groups = True

    def __init__(self, delta_weight: float = DELTA_WEIGHT, background_bases: bool = False) -> None:
        if not delta_weight > 0:
            raise ValueError(f"delta_weight must be positive; got {delta_weight}")
        self.delta_weight = delta_weight
        self.background_bases = background_bases  # bases written by forked children (materialize)

    def seed(self, job: SnapshotSource, ctx: SeedContext) -> Seed | None:
        """A base of ``ctx.key_groups`` (what a live rescale's copy loaded, not served yet), written
        now while writes go on, and the partition's log cut as it froze: the first checkpoint
        that holds them chains on it instead of writing them whole."""
        partition = job.partition
        assert isinstance(partition, HeapPartition), "the heap store only opens heap partitions"
        wanted = [r for r in ctx.key_groups if len(r)]
        if partition.changes is None or not wanted:
            return None
        with job.exclusive():
            view = partition.freeze()
            cut = partition.changes.cut_seed()
        try:
            span = KeyGroupRange(min(r.start for r in wanted), max(r.end for r in wanted))
            header = SnapshotHeader(
                job.name, job.max_parallelism, span, keyed_tables(view.tables()), descriptor_dicts(job)
            )
            # A delta of no changed key, the wanted key groups whole: their base.
            records = delta_records(view, {}, header, {kg for r in wanted for kg in r})
            path = f"{shared_dir(ctx.name)}/{uuid.uuid4().hex}-heap-seed"
            with ctx.storage.create_output(path) as out:
                written = write_sections(out, header, ctx.codec, job.clock.now_ms(), lambda: False, records)
        except BaseException:
            _let_go(job, cut)
            raise
        finally:
            view.release()
        chains = tuple(ChangelogChain(h) for r in wanted if (h := written.restricted(r)) is not None)
        return Seed("heap", {path: written.stream}, chains, cut)

    def materialization_due(self, previous: SnapshotPart) -> bool:
        keyed = previous.metadata.keyed
        if not self.background_bases or not isinstance(keyed, ChangelogHandle):
            return False
        bases, deltas = _weights(keyed.chains)
        long_chain = any(len(chain.deltas) >= MAX_DELTAS // 2 for chain in keyed.chains)
        return bases >= MATERIALIZE_MIN_BYTES and (
            deltas >= MATERIALIZE_SHARE * self.delta_weight * bases or long_chain
        )

    def materialize(self, job: SnapshotSource, ctx: SeedContext) -> Seed | None:
        """A base of all of the job's key groups, written by a forked child from the fork's memory
        while writes go on (:mod:`~statehouse.backends.heap.materialize`), and the log cut at the
        fork; None where memory leaves no room for the fork's copy."""
        partition = job.partition
        assert isinstance(partition, HeapPartition), "the heap store only opens heap partitions"
        if partition.changes is None or not room_for_a_copy():
            return None
        if ctx.scratch is not None:
            os.makedirs(ctx.scratch, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=ctx.scratch)
        path = f"{shared_dir(ctx.name)}/{uuid.uuid4().hex}-heap-seed"
        cut: Cut | None = None
        try:
            with job.exclusive():
                view = partition.freeze()
                cut = partition.changes.cut_seed()
                try:
                    tables, states = keyed_tables(view.tables()), descriptor_dicts(job)
                    header = SnapshotHeader(job.name, job.max_parallelism, job.key_group_range, tables, states)
                    pid = fork_writer(view, header, ctx.codec, job.clock.now_ms(), scratch, path)
                finally:
                    view.release()  # the child holds the fork's copy
            written = wait_for(pid, scratch, ctx.cancel, MATERIALIZE_TIMEOUT_S)
            stream = ctx.storage.put_file(path, os.path.join(scratch, path))
        except BaseException:  # no base (the fork refused, the writer failed, the upload): no taker for the cut
            if cut is not None:
                _let_go(job, cut)
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        written = dataclasses.replace(written, stream=stream)
        return Seed("heap", {path: stream}, (ChangelogChain(written),), cut)

    def unseed(self, job: SnapshotSource, seed: Seed) -> None:
        """Unpin the seed's cut: pinned, the log would keep every change since it until its bound,
        then lose them all (a base)."""
        if seed.cut is not None:
            _let_go(job, seed.cut)

    def prepare(self, job: SnapshotSource, ctx: SnapshotContext) -> AsyncSnapshot:
        partition = job.partition
        assert isinstance(partition, HeapPartition), "the heap store only opens heap partitions"
        view = partition.freeze()
        changes, kept, segments, why = partition.changes, None, None, "the partition notes no changes"
        whole: set[int] = set()  # key groups written whole: the kept chains do not hold them
        if changes is not None:
            changes.cut(ctx.checkpoint_id)
            kept, why = _builds_on(ctx.previous, job)
            cuts = [checkpoint_cut(ctx.previous.metadata.checkpoint_id)] if kept and ctx.previous else []
            seeded, seed_cut = _seeded(ctx.seed, job)
            if seeded and seed_cut is not None:
                # A seed's key groups chain on it (a materialization's in place of the kept chains):
                # the log since its cut holds what changed after it.
                kept = _outside(kept or [], {kg for chain in seeded for kg in chain.key_group_range})
                kept, cuts = [*kept, *seeded], [*(cuts if kept else []), seed_cut]
            if kept and cuts:
                segments = changes.since(min(cuts))
                why = "the partition's log did not follow every write since the checkpoint (or seed) built on"
                if segments is not None:
                    held = {kg for chain in kept for kg in chain.key_group_range}
                    whole = {kg for kg in job.key_group_range if kg not in held}
                    whole.update(kg for kg in replaced_whole(segments) if kg in job.key_group_range)
                    if len(whole) == len(job.key_group_range):
                        segments, why = None, "every key group of its range was replaced whole"
            if ctx.seed is not None and ctx.seed.cut is not None:
                # The seed is taken: no later checkpoint builds on its cut, whichever cut this one
                # built on (a staying replica's older checkpoint's, for the key groups it held).
                changes.unpin(ctx.seed.cut)
        states = descriptor_dicts(job)
        header = SnapshotHeader(job.name, job.max_parallelism, job.key_group_range, keyed_tables(view.tables()), states)
        now_ms = job.clock.now_ms()  # TTL cleanup judges expiry as of the freeze

        def body() -> SnapshotResult:
            changed, reason, rewritten = None, why, whole
            unread: dict[str, set[int]] = {}
            if segments is not None and kept is not None:
                state_keys = view.key_count()
                reason = "half the state's keys or more changed"
                # Twice as many rows as the state has keys: most keys changed, or a base is
                # cheaper than the batch was anyway; no need to merge the keys to know.
                if noted_rows(segments) < REWRITES * state_keys:
                    keys = union(segments, max(1, int(BASE_SHARE * state_keys)))
                    if keys is not None:
                        changed, unread = by_key_group(keys), keys.unread
                if changed is not None:
                    counts = collections.Counter[int]()
                    for by_group in changed.values():
                        counts.update({kg: len(group) for kg, group in by_group.items()})
                    held = _outside(kept, whole)
                    rewritten = whole | rebased(held, job.key_group_range, counts, state_keys, self.delta_weight)
                    if len(rewritten) == len(job.key_group_range):
                        changed, reason = None, "every slice of key groups is due to be rewritten"
            if changed is None:
                log.debug("checkpoint %d of job %s writes a base: %s", ctx.checkpoint_id, ctx.job, reason)
            path = f"{shared_dir(ctx.job)}/{uuid.uuid4().hex}-heap-{'delta' if changed is not None else 'base'}"
            ctx.written.append(path)
            with ctx.storage.create_output(path) as out:
                if changed is None:
                    written = write_key_groups(view, out, header, ctx.codec, now_ms, ctx.cancel.is_set)
                else:
                    records = delta_records(view, changed, header, rewritten, unread)
                    written = write_sections(out, header, ctx.codec, now_ms, ctx.cancel.is_set, records)
            ctx.check_cancelled()
            operator = write_operator_state(ctx, OperatorSnapshot.from_view(view))
            if changed is None or kept is None:
                keyed, reused = ChangelogHandle.of(written), 0
            else:
                keyed, reused = _chained(kept, rewritten, written)
            return SnapshotResult(
                "changelog",
                keyed.relative_to(ctx.directory),
                operator.relative_to(ctx.directory),
                states,
                job.max_parallelism,
                written.stream.size + operator.size,
                reused,
            )

        return AsyncSnapshot(view, body)
