"""A job's writer epochs (fencing) and the anchor of its last committed micro-batch."""

from __future__ import annotations

from statehouse.backends.base.partition import StorePartition
from statehouse.backends.base.transaction import PartitionTransaction
from statehouse.backends.bounds import MAX_EPOCH, check_range
from statehouse.backends.errors import StaleEpoch
from statehouse.backends.job_life import JobLife
from statehouse.backends.reserved import COMMITTED_BATCH_META, COMMITTED_EPOCH_META, EPOCH_META, META_TABLE
from statehouse.backends.staging import Staging
from statehouse.protocol.errors import InvalidArgument


class WriterEpochs:
    """The writer epoch a coordinator fences a job with, and the epoch and Spark micro-batch the
    job's last commit applied.

    All three live in the job's metadata table, not in memory, so that every snapshot, restore
    and move carries them with the state they describe (the exactly-once anchor). A fence raises
    the epoch under the job's lock and drops what older epochs staged, which can never commit."""

    def __init__(self, job: str, partition: StorePartition, staging: Staging, life: JobLife) -> None:
        self.job = job  # the job's name, for errors
        self.partition = partition
        self.staging = staging
        self.life = life

    @property
    def current(self) -> int:
        """The current writer epoch; writes that name an epoch must name this one."""
        raw = self.partition.get_meta(EPOCH_META)
        return int(raw) if raw is not None else 0

    def fence(self, epoch: int, *, opens_batch: bool = False) -> int:
        """Raise the writer epoch to ``epoch`` (never lower it): writers of older epochs are fenced off.
        ``opens_batch``: a coordinator begins a micro-batch under it (``Staging.in_flight``)."""
        if epoch > MAX_EPOCH and self.current == MAX_EPOCH:
            # The ceiling is reached only by a fence naming it (a micro-batch raises the epoch by one).
            raise InvalidArgument(
                f"job {self.job!r}'s writer epoch is at its ceiling {MAX_EPOCH}: no epoch can follow it (writes "
                "under it still work). To fence again, delete the job and restore a checkpoint or savepoint taken "
                "before it was fenced to the ceiling: a snapshot holds the writer epoch it was taken at"
            )
        check_range(epoch, "epoch", MAX_EPOCH)  # an epoch past it could never be named again
        with self.life.exclusive():
            current = self.current
            if epoch > current:
                tx = PartitionTransaction(self.partition)
                tx.put(META_TABLE, 0, EPOCH_META, str(epoch).encode())
                tx.commit()
                current = epoch
                self.staging.drop()  # what older epochs staged can never commit
            if opens_batch:
                self.staging.open_batch(current)
            return current

    def check(self, epoch: int) -> None:
        """Refuse a write naming ``epoch`` unless it is the current writer epoch."""
        check_range(epoch, "epoch", MAX_EPOCH)
        current = self.current
        if epoch != current:
            raise StaleEpoch(
                f"write epoch {epoch} is not the job's current writer epoch {current}: this attempt was fenced off "
                "(or the coordinator has not fenced yet)",
                epoch=current,
            )

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

    @staticmethod
    def record_commit(tx: PartitionTransaction, epoch: int, batch: int | None) -> None:
        """Write into ``tx`` that it commits the staged writes of ``epoch`` (micro-batch ``batch``)."""
        tx.put(META_TABLE, 0, COMMITTED_EPOCH_META, str(epoch).encode())
        if batch is not None:
            tx.put(META_TABLE, 0, COMMITTED_BATCH_META, str(batch).encode())
