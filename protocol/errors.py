"""The base of Statehouse's domain errors, below every folder of the server.

A :class:`StateError` carries a stable ``code`` and a ``detail`` that says what to fix; the HTTP
layer maps codes to statuses in one place (``statehouse.app.problems.STATUS_BY_CODE``). It sits
here, not in ``backends/``, so that the snapshot interfaces (below the backends) raise the same
kind of error the engine does; so do the refusals of names, keys and values, which the stored-state
encoding (``statehouse.snapshots.stored``, also below the backends) raises.
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


class ValueTooDeep(StateError):
    """A stored value (from before values were limited to ``codec.MAX_DEPTH`` levels: an older
    data directory or snapshot) nests deeper than an answer's format can write."""

    code = "value_too_deep"


class IncompatibleState(StateError):
    """Re-registering a state under an incompatible descriptor (Flink: StateMigrationException)."""

    code = "incompatible_state"
