"""The heap backend's checkpoints as a changelog: a checkpoint writes the keys that changed since
the last completed one, over a full base it shares with the checkpoints before it (Flink's
changelog state backend, materialized: FLIP-158). A full snapshot of a heap state costs its whole
size every checkpoint; a delta costs what changed.

A checkpoint writes a new base instead of a delta when it cannot or should not build on the last
one: no completed checkpoint of this layout whose cut the partition's log followed
(:class:`~statehouse.backends.heap.changes.ChangeLog`), half the state or more changed (a delta
would be as large, and reading it back twice as slow), or the deltas already weigh as much as
their base (so a restore reads at most about twice the state). Savepoints stay in the canonical
full format, self-contained.
"""

from __future__ import annotations

import logging
import uuid

from statehouse.backends.base.snapshot import SnapshotSource
from statehouse.backends.heap.changes import by_key_group, noted_rows, replaced_whole, union
from statehouse.backends.heap.partition import HeapPartition
from statehouse.backends.reserved import keyed_tables
from statehouse.backends.snapshot.full_format import delta_records, write_key_groups, write_sections
from statehouse.backends.snapshot.full_strategy import JobStrategy, descriptor_dicts, write_operator_state
from statehouse.backends.snapshot.operator_format import OperatorSnapshot
from statehouse.snapshots.full_format import SnapshotHeader
from statehouse.snapshots.handles import ChangelogHandle
from statehouse.snapshots.layout import shared_dir
from statehouse.snapshots.metadata import SnapshotFormat, SnapshotPart
from statehouse.snapshots.strategy import AsyncSnapshot, SnapshotContext, SnapshotResult

log = logging.getLogger(__name__)

BASE_SHARE = 0.5  # a delta of this share of the state's keys or more: a base instead
MAX_DELTAS = 64  # deltas over one base at most: a restore's ranged reads stay few
REWRITES = 2  # rows written since, per key of the state, from which a base is written unmerged


def _builds_on(previous: SnapshotPart | None, job: SnapshotSource) -> tuple[ChangelogHandle | None, str]:
    """The changelog of ``previous``, root-relative, if a delta can follow it (a changelog of the
    same key groups and max parallelism whose deltas weigh less than their base); else why not."""
    if previous is None or not isinstance(keyed := previous.metadata.keyed, ChangelogHandle):
        return None, "no completed changelog checkpoint to build on"
    metadata = previous.metadata
    if metadata.key_group_range != job.key_group_range or metadata.max_parallelism != job.max_parallelism:
        return None, f"checkpoint {metadata.checkpoint_id} is of another layout"
    chain = keyed.under(previous.directory)
    if len(chain.deltas) >= MAX_DELTAS or sum(d.stream.size for d in chain.deltas) >= chain.base.stream.size:
        return None, f"the deltas of checkpoint {metadata.checkpoint_id} weigh as much as their base"
    return chain, ""


class ChangelogSnapshotStrategy(JobStrategy):
    """A heap job's checkpoint: a delta of the keys changed since the last completed checkpoint
    over that checkpoint's base and deltas, or a new base (see the module)."""

    format: SnapshotFormat = "changelog"

    def prepare(self, job: SnapshotSource, ctx: SnapshotContext) -> AsyncSnapshot:
        partition = job.partition
        assert isinstance(partition, HeapPartition), "the heap store only opens heap partitions"
        view = partition.freeze()
        changes, chain, segments, why = partition.changes, None, None, "the partition notes no changes"
        if changes is not None:
            changes.cut(ctx.checkpoint_id)
            chain, why = _builds_on(ctx.previous, job)
            if chain is not None and ctx.previous is not None:
                built_on = ctx.previous.metadata.checkpoint_id
                segments = changes.since(built_on)
                why = f"the partition's log did not follow every write since checkpoint {built_on}"
                if segments is not None and any(kg in job.key_group_range for kg in replaced_whole(segments)):
                    segments, why = None, "key groups of its range were replaced whole"
        states = descriptor_dicts(job)
        header = SnapshotHeader(job.name, job.max_parallelism, job.key_group_range, keyed_tables(view.tables()), states)
        now_ms = job.clock.now_ms()  # TTL cleanup judges expiry as of the freeze

        def body() -> SnapshotResult:
            changed, reason = None, why
            if segments is not None:
                state_keys = view.key_count()
                reason = "half the state's keys or more changed"
                # Twice as many rows as the state has keys: most keys changed, or a base is
                # cheaper than the batch was anyway; no need to merge the keys to know.
                if noted_rows(segments) < REWRITES * state_keys:
                    keys = union(segments, max(1, int(BASE_SHARE * state_keys)))
                    changed = None if keys is None else by_key_group(keys)
            if changed is None:
                log.debug("checkpoint %d of job %s writes a base: %s", ctx.checkpoint_id, ctx.job, reason)
            path = f"{shared_dir(ctx.job)}/{uuid.uuid4().hex}-heap-{'delta' if changed is not None else 'base'}"
            ctx.written.append(path)
            with ctx.storage.create_output(path) as out:
                if changed is None:
                    written = write_key_groups(view, out, header, ctx.codec, now_ms, ctx.cancel.is_set)
                else:
                    records = delta_records(view, changed, header)
                    written = write_sections(out, header, ctx.codec, now_ms, ctx.cancel.is_set, records)
            ctx.check_cancelled()
            operator = write_operator_state(ctx, OperatorSnapshot.from_view(view))
            if changed is None or chain is None:
                keyed, reused = ChangelogHandle(written), 0
            else:
                keyed = ChangelogHandle(chain.base, (*chain.deltas, written))
                reused = sum(h.stream.size for h in chain.streams())
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


CHANGELOG = ChangelogSnapshotStrategy()
