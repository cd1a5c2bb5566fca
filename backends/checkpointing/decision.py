"""The durable decision of a live rescale: one record per target topology version, in the
checkpoint storage every replica of the set shares (``_topology/<set_id>/rescale-v<version>.json``).

After a failure anywhere in a move, this record, not any replica's memory, says which layout
serves: commit (the move only goes forward) or abort (only back); no record, undecided. It is
written once: deciding the same outcome again answers the record, the other outcome is refused
(409 ``rescale_decided``).

Write-once over storages without a conditional put (a local directory, S3-compatible servers):
the record is read, written if absent, and read back; two coordinators deciding at the same
instant could both pass the first read, and the read-back then tells the loser whose outcome
stands. One coordinator drives a move (docs/rescale.md), so this is a guard, not a lock service;
within one process a lock serializes deciders.

"_topology" cannot be a job's directory: a job name cannot start with "_".
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from statehouse.protocol.errors import StateError
from statehouse.snapshots.storage.base import CheckpointStorage

Outcome = Literal["commit", "abort"]
FORMAT = 1
_decide_lock = threading.Lock()


class RescaleDecided(StateError):
    """The move was decided the other way already: the decision is written once."""

    code = "rescale_decided"


class DecisionUnreadable(StateError):
    """The decision's storage did not answer (or holds something that is not a decision)."""

    code = "storage_unavailable"


@dataclass(frozen=True)
class Decision:
    """The outcome of the move of replica set ``set_id`` to ``replica_count`` replicas at topology
    ``version``, with what the coordinator moved (``checkpoints``: job -> checkpoint id), what it
    wants whoever resumes the move to know (``metadata``, free-form JSON: e.g. each checkpoint's
    metadata, which the replicas no longer list once they serve the new layout's parts), where
    the new replicas answer (``replica_urls``) and the count it started from (``from_count``);
    ``decided`` in Unix seconds."""

    set_id: str
    version: int
    outcome: Outcome
    replica_count: int | None = None
    replica_urls: tuple[str, ...] = ()
    checkpoints: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    decided: float = field(default_factory=time.time)
    # The replica count the move started from: once every old replica committed, they no longer
    # say it, and a coordinator resuming the move for a joining replica still needs it.
    from_count: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "set_id": self.set_id,
            "version": self.version,
            "outcome": self.outcome,
            "replica_count": self.replica_count,
            "replica_urls": list(self.replica_urls),
            "checkpoints": dict(sorted(self.checkpoints.items())),
            "metadata": self.metadata,
            "decided": self.decided,
            "from_count": self.from_count,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Decision:
        if data.get("format") != FORMAT or data.get("outcome") not in ("commit", "abort"):
            raise ValueError(f"not a rescale decision: format {data.get('format')!r}, outcome {data.get('outcome')!r}")
        count, before = data.get("replica_count"), data.get("from_count")
        return cls(
            str(data["set_id"]),
            int(data["version"]),
            data["outcome"],
            int(count) if count is not None else None,
            tuple(str(u) for u in data.get("replica_urls", ())),
            {str(k): int(v) for k, v in data.get("checkpoints", {}).items()},
            dict(data.get("metadata") or {}),
            float(data.get("decided", 0)),
            int(before) if before is not None else None,  # None: a record without the field
        )


def decision_path(set_id: str, version: int) -> str:
    return f"_topology/{set_id}/rescale-v{version}.json"


def read_decision(storage: CheckpointStorage, set_id: str, version: int) -> Decision | None:
    """The decision of the move to ``version``, or None (undecided). Raises
    :class:`DecisionUnreadable` when the storage fails or holds something else there."""
    path = decision_path(set_id, version)
    try:
        data = storage.read(path)
    except FileNotFoundError:
        return None
    except StateError:  # the storage's own 503 (S3 unavailable) says what failed
        raise
    except Exception as exc:  # S3 down, permissions, a network error: undecided is not known
        raise DecisionUnreadable(
            f"the rescale decision {path} in {storage.location} cannot be read ({exc}); retry once the storage answers"
        ) from exc
    try:
        return Decision.from_json(json.loads(data))
    except (ValueError, KeyError, TypeError) as exc:
        raise DecisionUnreadable(f"{path} in {storage.location} is not a rescale decision ({exc})") from None


def decide(storage: CheckpointStorage, decision: Decision) -> Decision:
    """Write ``decision`` unless one exists; the decision that stands (the existing one when it
    has the same outcome). Raises :class:`RescaleDecided` when the other outcome stands."""
    path = decision_path(decision.set_id, decision.version)
    with _decide_lock:
        existing = read_decision(storage, decision.set_id, decision.version)
        if existing is None:
            with storage.create_output(path) as out:
                out.write(json.dumps(decision.to_json(), indent=1).encode())
                out.close_and_get_handle()
            existing = read_decision(storage, decision.set_id, decision.version)
            assert existing is not None, f"{path} vanished after it was written"
    if existing.outcome != decision.outcome:
        raise RescaleDecided(
            f"the live rescale to topology version {decision.version} was decided {existing.outcome} already; it "
            f"cannot {decision.outcome} (the decision is written once): "
            + (
                "finish it with statehouse rescale --resume"
                if existing.outcome == "commit"
                else "abort it everywhere with statehouse rescale --abort, then rescale again"
            ),
            version=decision.version,
            outcome=existing.outcome,
        )
    return existing
