"""``_metadata``: what one replica's part of a checkpoint or savepoint holds.

Written last, after every file it names is durable: a part without metadata does not exist
for restore. It is JSON (readable by operators with ``cat``) wrapped with a SHA-256 of its
own body, so a torn or edited file is refused rather than misread. Handle paths are
relative to the snapshot directory.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.errors import SnapshotCorrupt
from statehouse.snapshots.handles import (
    ChangelogHandle,
    IncrementalHandle,
    KeyedHandle,
    StreamHandle,
    keyed_handle_from_dict,
)
from statehouse.snapshots.layout import SnapshotKind

SnapshotFormat = Literal["full", "incremental", "changelog"]
_MAGIC = "statehouse-snapshot"
_VERSION = 1


_BODY = b'{"body":'
_DIGEST = b',"sha256":"'
_TAIL = len(_DIGEST) + 64 + len(b'"}')  # the digest's part of the file: its key, 64 hex digits, the end


def _checked_body(data: bytes) -> dict[str, Any] | None:
    """A ``_metadata`` file's body if its checksum holds. As written (the canonical body as it is,
    then its digest), the digest is checked over those bytes; any other JSON of the same wrapper
    (indented by hand, or by an earlier writer) over its body encoded canonically again."""
    if data.startswith(_BODY) and data[-_TAIL:].startswith(_DIGEST) and data.endswith(b'"}'):
        canonical, digest = data[len(_BODY) : -_TAIL], data[-_TAIL + len(_DIGEST) : -2]
        if hashlib.sha256(canonical).hexdigest().encode() == digest:
            body = json.loads(canonical)
            return body if isinstance(body, dict) else None
    wrapper = json.loads(data)
    body = wrapper["body"]
    canonical_again = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return body if hashlib.sha256(canonical_again.encode()).hexdigest() == wrapper["sha256"] else None


@dataclass(frozen=True, slots=True)
class SnapshotMetadata:
    """The ``_metadata`` of one replica's part of a checkpoint or savepoint (Flink's
    ``CheckpointMetadata``, per part): its job, id, kind and format, key-group range and max
    parallelism, state descriptors, the handles of its keyed and operator files, and the epoch it
    committed; written last, in checksummed JSON, so a part without it does not exist for restore."""

    job: str
    checkpoint_id: int
    kind: SnapshotKind
    format: SnapshotFormat
    replica_index: int
    replica_count: int
    max_parallelism: int
    key_group_range: KeyGroupRange
    backend: str
    timestamp_ms: int
    states: list[dict[str, Any]]  # keyed state descriptors
    keyed: KeyedHandle
    operator: StreamHandle
    bytes_uploaded: int
    bytes_reused: int
    duration_ms: int
    user_metadata: dict[str, Any] = field(default_factory=dict)  # the coordinator's, e.g. the batch id
    committed_epoch: int = 0  # the last task-attempt epoch committed into this state; restored with it
    committed_batch: int | None = None  # the micro-batch that epoch applied (None: no commit named one)

    def shared_handles(self) -> dict[str, StreamHandle]:
        keyed = self.keyed
        if isinstance(keyed, ChangelogHandle):
            return {h.stream.path: h.stream for h in keyed.streams()}
        return dict(keyed.shared) if isinstance(keyed, IncrementalHandle) else {}

    def part_files(self) -> list[str]:
        """The part's own files, relative to its snapshot directory (not the shared files it uses,
        nor its ``_metadata``): everything its attempt wrote under the part, so deleting the part
        needs no listing of it."""
        keyed = self.keyed
        if isinstance(keyed, IncrementalHandle):
            own = [*keyed.private.values()]
        else:
            own = [] if isinstance(keyed, ChangelogHandle) else [keyed.stream]
        return sorted(h.path for h in (*own, self.operator))

    def to_bytes(self) -> bytes:
        """The ``_metadata`` file: the fields as JSON, beside the SHA-256 of their canonical form."""
        body = {
            "magic": _MAGIC,
            "version": _VERSION,
            "job": self.job,
            "checkpoint_id": self.checkpoint_id,
            "kind": self.kind,
            "format": self.format,
            "replica_index": self.replica_index,
            "replica_count": self.replica_count,
            "max_parallelism": self.max_parallelism,
            "key_group_range": self.key_group_range.as_list(),
            "backend": self.backend,
            "timestamp_ms": self.timestamp_ms,
            "states": self.states,
            "keyed": self.keyed.to_dict(),
            "operator": self.operator.to_dict(),
            "bytes_uploaded": self.bytes_uploaded,
            "bytes_reused": self.bytes_reused,
            "duration_ms": self.duration_ms,
            "user_metadata": self.user_metadata,
            "committed_epoch": self.committed_epoch,
            "committed_batch": self.committed_batch,
        }
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        digest = hashlib.sha256(canonical).hexdigest()
        # The canonical body is the file's body as it is (the wrapper's keys in order too): one
        # encoding, not indented. A part's handles name every key group's section (32,768 of them
        # per stream at most): indented by the standard library's pure-Python encoder, the file
        # would be a third larger and three times as slow to write.
        return _BODY + canonical + _DIGEST + digest.encode() + b'"}'

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> SnapshotMetadata:
        """Read a ``_metadata`` file back; ``SnapshotCorrupt`` (naming ``where``) if its checksum,
        magic, version or fields do not hold."""
        try:
            body = _checked_body(data)
            if body is None:
                raise SnapshotCorrupt(f"snapshot metadata {where} fails its checksum; it is corrupt")
            if body["magic"] != _MAGIC or body["version"] != _VERSION:
                raise SnapshotCorrupt(f"{where} is not Statehouse snapshot metadata of version {_VERSION}")
            start, end = body["key_group_range"]
            return cls(
                job=body["job"],
                checkpoint_id=int(body["checkpoint_id"]),
                kind=body["kind"],
                format=body["format"],
                replica_index=int(body["replica_index"]),
                replica_count=int(body["replica_count"]),
                max_parallelism=int(body["max_parallelism"]),
                key_group_range=KeyGroupRange(start, end),
                backend=body["backend"],
                timestamp_ms=int(body["timestamp_ms"]),
                states=list(body["states"]),
                keyed=keyed_handle_from_dict(body["keyed"]),
                operator=StreamHandle.from_dict(body["operator"]),
                bytes_uploaded=int(body["bytes_uploaded"]),
                bytes_reused=int(body["bytes_reused"]),
                duration_ms=int(body["duration_ms"]),
                user_metadata=dict(body.get("user_metadata") or {}),
                committed_epoch=int(body.get("committed_epoch", 0)),  # absent before task-attempt epochs
                committed_batch=_optional_int(body.get("committed_batch")),  # absent before batches were recorded
            )
        except SnapshotCorrupt:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotCorrupt(f"snapshot metadata {where} is unreadable: {exc}") from None


@dataclass(frozen=True, slots=True)
class SnapshotPart:
    """One replica's part of a snapshot: its metadata and the directory that holds it."""

    directory: str  # root-relative; handle paths in the metadata are relative to it
    metadata: SnapshotMetadata


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
