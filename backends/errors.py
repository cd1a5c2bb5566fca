"""Domain errors of the state engine.

Each carries a stable ``code``; the HTTP layer maps codes to status codes in one place.
"""

from __future__ import annotations

from typing import Any


class StateError(Exception):
    """Base class: ``code`` is stable and documented, ``detail`` says what to fix."""

    code = "state_error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra

    def within(self, where: str, **extra: Any) -> StateError:
        """Say where in a request this happened (an operation of a batch, a row of columns)."""
        self.detail = f"{where}: {self.detail}"
        self.extra.update(extra)
        return self

    def unplaced(self, label: str, key: str | None = None) -> Any:
        """Undo :meth:`within` for a place ``label N`` kept in ``extra[key]`` (default: the
        label); returns N, or ``None`` when the error named no such place."""
        place = self.extra.pop(key or label, None)
        if place is not None:
            self.detail = self.detail.removeprefix(f"{label} {place}: ")
        return place


class InvalidName(StateError):
    code = "invalid_name"


class InvalidArgument(StateError):
    code = "invalid_argument"


class InvalidKey(StateError):
    code = "invalid_key"


class InvalidValue(StateError):
    code = "invalid_value"


class JobNotFound(StateError):
    code = "job_not_found"


class JobConflict(StateError):
    """E.g. a different max_parallelism for a job that exists."""

    code = "job_conflict"


class StateNotFound(StateError):
    code = "state_not_found"


class IncompatibleState(StateError):
    """Re-registering a state under an incompatible descriptor (Flink: StateMigrationException)."""

    code = "incompatible_state"


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
