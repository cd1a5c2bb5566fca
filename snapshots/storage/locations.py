"""Where a restore may read from: the location policy of one replica.

A restore names a snapshot by ``location`` (a checkpoint's or savepoint's ``location``). The
replica's own checkpoint storage decides what it may open:

* a local path (or ``file://``) only inside the local checkpoint storage — no path traversal
  to the rest of the replica's filesystem; none when checkpoints go to S3;
* ``s3://`` as far as the replica's S3 credentials reach;
* ``memory://`` only when the checkpoint storage is itself in memory (a test deployment).
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from statehouse.snapshots.errors import InvalidLocation
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.storage.base import CheckpointStorage
from statehouse.snapshots.storage.local import LocalStorage
from statehouse.snapshots.storage.memory import MemoryStorage


def _local_path(location: str) -> str | None:
    if "://" not in location:
        return location
    parsed = urlparse(location)
    return parsed.path if parsed.scheme == "file" else None


class RestoreLocations:
    def __init__(self, storage: CheckpointStorage, *, s3_endpoint_url: str | None = None) -> None:
        self.storage = storage
        self.s3_endpoint_url = s3_endpoint_url

    def check(self, location: str) -> None:
        """Refuse a location this replica may not read (``invalid_location``)."""
        if not isinstance(location, str) or not location.strip() or "\0" in location:
            raise InvalidLocation("a restore location must be a non-empty path or URL without NUL bytes")
        if location.startswith("memory://") and not isinstance(self.storage, MemoryStorage):
            raise InvalidLocation(
                f"memory:// locations are test storage; this replica's checkpoints are in {self.storage.location}"
            )
        path = _local_path(location)
        if path is None:
            return
        root = self.storage.root if isinstance(self.storage, LocalStorage) else None
        inside = root is not None and os.path.commonpath([os.path.realpath(root), os.path.realpath(path)]) == (
            os.path.realpath(root)
        )
        if not inside:
            raise InvalidLocation(
                f"local restore locations must lie inside the checkpoint storage ({self.storage.location}); "
                f"got {location!r}"
            )

    def open(self, location: str) -> CheckpointStorage:
        self.check(location)
        return open_storage(location, s3_endpoint_url=self.s3_endpoint_url)
