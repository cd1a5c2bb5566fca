"""Domain errors of the state engine.

Each carries a stable ``code``; the HTTP layer maps codes to status codes in one place.
"""

from __future__ import annotations

# The base lives below every folder (the snapshot interfaces raise it too); re-exported here.
from statehouse.protocol.errors import StateError as StateError


class JobNotFound(StateError):
    code = "job_not_found"


class JobConflict(StateError):
    """E.g. a different max_parallelism for a job that exists."""

    code = "job_conflict"


class StateNotFound(StateError):
    code = "state_not_found"


class WrongStateKind(StateError):
    code = "wrong_state_kind"


class KeyNotOwned(StateError):
    """The key's key group belongs to another replica; ``owner`` says which."""

    code = "key_not_owned"

    def __init__(self, detail: str, *, key_group: int, owner: int, version: int) -> None:
        super().__init__(detail, key_group=key_group, owner=owner, version=version)
        self.key_group = key_group
        self.owner = owner
        self.version = version


class RescaleInProgress(StateError):
    """A write into a key group a live rescale is moving to another replica (or to operator state
    while the job's replica is frozen for the move): reads go on, writes wait for the new layout,
    ``version`` (the target topology version) says which one to retry on."""

    code = "rescale_in_progress"
    # A freeze lasts about a second: a client that knows (``retry_after_ms``) retries at this pace,
    # while ``Retry-After`` (whole seconds) serves the others.
    retry_after_ms = 200

    def __init__(self, detail: str, *, version: int) -> None:
        super().__init__(detail, topology_version=version, retry_after_ms=self.retry_after_ms)
        self.version = version


class BatchInFlight(StateError):
    """A freeze for a live rescale was refused: an open epoch's staged writes (an uncommitted
    micro-batch) touch a key group that would move. ``epochs`` names them; nothing was frozen."""

    code = "batch_in_flight"

    def __init__(self, detail: str, *, job: str, epochs: list[int]) -> None:
        super().__init__(detail, job=job, epochs=epochs)
        self.job = job
        self.epochs = epochs


class LayoutMismatch(StateError):
    """The job's data on this replica holds other key groups than the replica's topology gives it
    (the replica adopted a new replica count): it is not served until a restore replaces it."""

    code = "layout_mismatch"


class StaleEpoch(StateError):
    """A write carried a writer epoch other than the job's current one (a fenced-off attempt)."""

    code = "stale_epoch"


class JobReplaced(StateError):
    """The job was replaced by a restore while this request held it: retry, it reaches the new one."""

    code = "not_ready"


class OperatorStateConflict(StateError):
    """E.g. an operator list state re-declared with another distribution mode."""

    code = "operator_state_conflict"


class AttemptLost(StateError):
    """This replica does not hold (all of) a task attempt's staged writes: it restarted, was
    restored, or the epoch's staging was dropped. The task (or the micro-batch) must re-run."""

    code = "attempt_lost"


class AttemptConflict(StateError):
    """A task attempt's requests arrived out of order, or one attempt id names two partitions."""

    code = "attempt_conflict"


class EpochSealed(StateError):
    """The epoch was prepared (or committed): its staging takes no more writes."""

    code = "epoch_sealed"


class InsufficientStorage(StateError):
    """The data volume cannot take the write (below its reserve, or full): free space, retry."""

    code = "insufficient_storage"
