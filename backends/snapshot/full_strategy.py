"""The canonical snapshot strategy: every key group of the replica's range in the full format,
from any backend's frozen view (heap checkpoints, RocksDB full checkpoints, every savepoint).
RocksDB's incremental strategy is in ``statehouse.backends.rocksdb.snapshot``."""

from __future__ import annotations

from typing import Any

from statehouse.backends.base.snapshot import SnapshotSource
from statehouse.backends.reserved import keyed_tables
from statehouse.backends.snapshot.full_format import write_key_groups
from statehouse.backends.snapshot.operator_format import OperatorSnapshot
from statehouse.snapshots.full_format import SnapshotHeader
from statehouse.snapshots.handles import StreamHandle
from statehouse.snapshots.metadata import SnapshotFormat
from statehouse.snapshots.strategy import AsyncSnapshot, SnapshotContext, SnapshotResult, SnapshotStrategy

JobStrategy = SnapshotStrategy[SnapshotSource]
"""What a store's :meth:`~statehouse.backends.base.store.Store.snapshot_strategy` returns: a
strategy over what it reads of a job (``Job`` is one), not over ``Job`` itself, which sits above."""


def descriptor_dicts(job: SnapshotSource) -> list[dict[str, Any]]:
    """The job's keyed-state descriptors as a snapshot stores them (sorted by name)."""
    return [job.descriptors[name].to_dict() for name in sorted(job.descriptors)]


def write_operator_state(ctx: SnapshotContext, operator: OperatorSnapshot) -> StreamHandle:
    """The operator-state file of a part (the same for every strategy); root-relative."""
    with ctx.storage.create_output(ctx.part_path("operator.bin")) as out:
        out.write(operator.to_bytes())
        handle = out.close_and_get_handle()
    ctx.written.append(handle.path)
    return handle


class FullSnapshotStrategy(JobStrategy):
    """The canonical format: every key group of the replica's range, from any backend's view."""

    format: SnapshotFormat = "full"

    def prepare(self, job: SnapshotSource, ctx: SnapshotContext) -> AsyncSnapshot:
        view = job.partition.freeze()
        states = descriptor_dicts(job)
        header = SnapshotHeader(job.name, job.max_parallelism, job.key_group_range, keyed_tables(view.tables()), states)
        now_ms = job.clock.now_ms()  # TTL cleanup judges expiry as of the freeze

        def body() -> SnapshotResult:
            with ctx.storage.create_output(ctx.part_path("keyed.bin")) as out:
                keyed = write_key_groups(view, out, header, ctx.codec, now_ms, ctx.cancel.is_set)
            ctx.written.append(keyed.stream.path)
            ctx.check_cancelled()
            operator = write_operator_state(ctx, OperatorSnapshot.from_view(view))
            uploaded = keyed.stream.size + operator.size
            keyed = keyed.relative_to(ctx.directory)
            return SnapshotResult(
                "full", keyed, operator.relative_to(ctx.directory), states, job.max_parallelism, uploaded, 0
            )

        return AsyncSnapshot(view, body)


FULL = FullSnapshotStrategy()
