"""Reading what checkpoint storage holds of a job: its snapshots' directories, their completed
parts and their metadata. Below the backends and in both distributions: the server's catalog
(``statehouse.backends.checkpointing.catalog``) and restore read through it, and so does a reader of a
checkpoint that has no server (the Spark data source's ``option("checkpoint", ...)``).
"""

from __future__ import annotations

from statehouse.snapshots.errors import CheckpointNotFound, SnapshotCorrupt
from statehouse.snapshots.layout import parse_job_listing, parse_metadata_name, snapshot_dir
from statehouse.snapshots.metadata import SnapshotMetadata, SnapshotPart
from statehouse.snapshots.storage.base import CheckpointStorage


def read_metadata(storage: CheckpointStorage, directory: str, name: str) -> SnapshotMetadata:
    path = f"{directory}/{name}" if directory else name
    try:
        data = storage.read(path)
    except FileNotFoundError:
        raise SnapshotCorrupt(f"snapshot metadata {path} is missing from {storage.location}") from None
    return SnapshotMetadata.from_bytes(data, f"{storage.location}/{path}")


def read_parts(storage: CheckpointStorage, directory: str, listing: list[str] | None = None) -> list[SnapshotPart]:
    """The completed replica parts of one snapshot directory (of one replica layout); their
    metadata read several at once. ``listing``: the directory's files, when the caller has them."""
    prefix = f"{directory}/" if directory else ""
    files = storage.list(directory) if listing is None else listing
    names = sorted(name for p in files if "/" not in (name := p[len(prefix) :]) and parse_metadata_name(name))
    parts = [
        SnapshotPart(directory, metadata)
        for metadata in storage.transfer(lambda name: read_metadata(storage, directory, name), names)
    ]
    # Parts of one snapshot come from one replica layout; if a directory has two, use the newest.
    counts = {p.metadata.replica_count for p in parts}
    if len(counts) > 1:
        newest = max(parts, key=lambda p: p.metadata.timestamp_ms).metadata.replica_count
        parts = [p for p in parts if p.metadata.replica_count == newest]
    return parts


def job_listing(storage: CheckpointStorage, job: str) -> list[str]:
    """Every file of ``job`` in ``storage``, relative to the job's directory."""
    return [p[len(job) + 1 :] for p in storage.list(job)]


def find_snapshot(storage: CheckpointStorage, job: str, checkpoint_id: int | None) -> str:
    """The directory of checkpoint or savepoint ``checkpoint_id``, else of the latest
    completed checkpoint of the job (any replica layout)."""
    if checkpoint_id is None:
        ids = [i for kind, i, _r, _n in parse_job_listing(job_listing(storage, job)) if kind == "checkpoint"]
        if not ids:
            raise CheckpointNotFound(f"job {job!r} has no completed checkpoint in {storage.location}")
        return snapshot_dir(job, max(ids), "checkpoint")
    return _named(storage, job, checkpoint_id)[0]


def find_parts(storage: CheckpointStorage, job: str, checkpoint_id: int | None) -> tuple[str, list[SnapshotPart]]:
    """:func:`find_snapshot` and its completed parts (:func:`read_parts`), a named one's
    directory listed once for both."""
    if checkpoint_id is None:
        directory = find_snapshot(storage, job, None)
        return directory, read_parts(storage, directory)
    directory, listing = _named(storage, job, checkpoint_id)
    return directory, read_parts(storage, directory, listing)


def _named(storage: CheckpointStorage, job: str, checkpoint_id: int) -> tuple[str, list[str]]:
    """The directory of checkpoint or savepoint ``checkpoint_id`` and its files. Its two possible
    directories are listed, not every file of the job: the shared table files of a large state
    are most of those, and a live rescale's load and decision ask inside the frozen window."""
    for kind in ("checkpoint", "savepoint"):
        directory = snapshot_dir(job, checkpoint_id, kind)
        listing = storage.list(directory)
        if any(parse_metadata_name(path[len(directory) + 1 :]) for path in listing):
            return directory, listing
    raise CheckpointNotFound(
        f"job {job!r} has no completed checkpoint or savepoint {checkpoint_id} in {storage.location}"
    )


def latest_complete(storage: CheckpointStorage, job: str) -> str:
    """The directory of the job's newest checkpoint that every replica of its layout completed
    (all ``n`` parts of ``replica-<i>-of-<n>`` present): what a reader without a coordinator
    can tell is a global checkpoint from storage alone."""
    parts: dict[tuple[int, int], set[int]] = {}
    for kind, checkpoint_id, index, count in parse_job_listing(job_listing(storage, job)):
        if kind == "checkpoint":
            parts.setdefault((checkpoint_id, count), set()).add(index)
    complete = [i for (i, count), indexes in parts.items() if indexes == set(range(count))]
    if not complete:
        raise CheckpointNotFound(f"job {job!r} has no checkpoint every replica completed in {storage.location}")
    return snapshot_dir(job, max(complete), "checkpoint")
