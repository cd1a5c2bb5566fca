"""Where a job's snapshot files go in checkpoint storage (Flink's directory layout).

::

    <root>/<job>/chk-<id>/_metadata.replica-<i>-of-<n>     written last: the part is complete
    <root>/<job>/chk-<id>/replica-<i>-of-<n>/...           the part's private files
    <root>/<job>/shared/<uuid>-<sst name>                  incremental SSTs, shared by reference
    <root>/<job>/savepoints/sp-<id>/...                    savepoints: same shape, never deleted
"""

from __future__ import annotations

import re
from typing import Literal

SnapshotKind = Literal["checkpoint", "savepoint"]

_METADATA = re.compile(r"^_metadata\.replica-(\d+)-of-(\d+)$")
_ENTRY = re.compile(r"^(?:chk-(\d+)|savepoints/sp-(\d+))/_metadata\.replica-(\d+)-of-(\d+)$")


def snapshot_dir(job: str, checkpoint_id: int, kind: SnapshotKind) -> str:
    if kind == "savepoint":
        return f"{job}/savepoints/sp-{checkpoint_id}"
    return f"{job}/chk-{checkpoint_id}"


def part_name(replica_index: int, replica_count: int) -> str:
    return f"replica-{replica_index}-of-{replica_count}"


def metadata_name(replica_index: int, replica_count: int) -> str:
    return f"_metadata.{part_name(replica_index, replica_count)}"


def shared_dir(job: str) -> str:
    return f"{job}/shared"


def parse_metadata_name(name: str) -> tuple[int, int] | None:
    """``(replica_index, replica_count)`` of a metadata file name, else ``None``."""
    match = _METADATA.match(name)
    return (int(match[1]), int(match[2])) if match else None


def parse_job_listing(paths: list[str]) -> list[tuple[SnapshotKind, int, int, int]]:
    """``(kind, id, replica_index, replica_count)`` of every metadata file in a job-relative listing."""
    found: list[tuple[SnapshotKind, int, int, int]] = []
    for path in paths:
        match = _ENTRY.match(path)
        if match:
            kind: SnapshotKind = "checkpoint" if match[1] else "savepoint"
            found.append((kind, int(match[1] or match[2]), int(match[3]), int(match[4])))
    return found


def parse_snapshot_dir_ids(paths: list[str], part: str) -> set[int]:
    """Ids of snapshots that hold files of replica part ``part`` (complete or not) in a job listing."""
    ids = set()
    for path in paths:
        match = re.match(r"^(?:chk-(\d+)|savepoints/sp-(\d+))/(?:_metadata\.)?([^/]+)", path)
        if match and match[3] == part:
            ids.add(int(match[1] or match[2]))
    return ids
