"""Where a restore may read from: the location policy of one replica.

A restore names a snapshot by ``location`` (a checkpoint's or savepoint's ``location``). A
replica reads only

* inside its own checkpoint storage (a local directory, ``s3://bucket/prefix``, or
  ``memory://`` in tests), and
* under the operator's extra restore locations (``STATEHOUSE_RESTORE_LOCATIONS``: local paths or
  ``s3://bucket/prefix``), which the HTTP layer opens to ``@admin`` tokens only.

Locations are normalized before they are compared and what was checked is what is opened: local
paths with symlinks resolved (``os.path.realpath``), bucket keys with ``.``/``..`` segments and
repeated slashes folded (as :class:`~statehouse.snapshots.storage.s3.S3Storage` folds them when
it reads). A key that climbs above its bucket, a query or a fragment, an unknown scheme: refused.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from urllib.parse import urlparse

from statehouse.snapshots.errors import InvalidLocation
from statehouse.snapshots.storage import S3Timeouts, open_storage
from statehouse.snapshots.storage.base import CheckpointStorage

_SCHEMES = ("file", "s3", "memory")


@dataclass(frozen=True)
class Place:
    """A normalized location: ``scheme`` file, s3 or memory; ``bucket`` ("" for files); ``path``
    absolute with symlinks resolved for files, a key prefix without outer slashes for buckets."""

    scheme: str
    bucket: str
    path: str

    @property
    def url(self) -> str:
        if self.scheme == "file":
            return self.path
        return f"{self.scheme}://{self.bucket}/{self.path}".rstrip("/")

    def relative(self, prefix: Place) -> str | None:
        """This place's path below ``prefix`` ("" for ``prefix`` itself), or ``None`` if outside it."""
        if (self.scheme, self.bucket) != (prefix.scheme, prefix.bucket):
            return None
        if self.scheme == "file":
            if prefix.path == "/":
                return self.path.lstrip("/")
            base = prefix.path
        else:
            if not prefix.path:
                return self.path
            base = "/" + prefix.path
        path = self.path if self.scheme == "file" else "/" + self.path
        if path == base:
            return ""
        return path[len(base) + 1 :] if path.startswith(base + "/") else None


def parse_place(location: str) -> Place:
    """Normalize a location (``InvalidLocation`` when it cannot be read as one)."""
    if not isinstance(location, str) or not location.strip() or "\0" in location:
        raise InvalidLocation("a location must be a non-empty path or URL without NUL bytes")
    if "://" not in location:
        return Place("file", "", os.path.realpath(location))
    try:
        parsed = urlparse(location)
    except ValueError as exc:  # e.g. an unbalanced '[' in the host
        raise InvalidLocation(f"location {location!r} is not a URL: {exc}") from None
    if parsed.scheme not in _SCHEMES:
        raise InvalidLocation(f"unsupported location {location!r}: use a path, file://, s3:// or memory://")
    if parsed.query or parsed.fragment or parsed.params or "?" in location or "#" in location:
        raise InvalidLocation(f"a location takes no query or fragment ('?', '#', ';'): {location!r}")
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InvalidLocation(f"file locations must be local: file:///path, got {location!r}")
        return Place("file", "", os.path.realpath(parsed.path or "/"))
    bucket = parsed.netloc or ("default" if parsed.scheme == "memory" else "")
    if not bucket or any(c in bucket for c in "@:/\\"):
        raise InvalidLocation(f"a bucket location is {parsed.scheme}://bucket/prefix, got {location!r}")
    key = posixpath.normpath(parsed.path.strip("/") or ".")
    if key == ".." or key.startswith("../"):
        raise InvalidLocation(f"location {location!r} climbs above its bucket")
    return Place(parsed.scheme, bucket, "" if key == "." else key)


def parse_restore_locations(text: str) -> tuple[str, ...]:
    """``STATEHOUSE_RESTORE_LOCATIONS``: comma-separated local paths or ``s3://bucket/prefix``, as
    canonical locations."""
    places = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        place = parse_place(entry)
        if place.scheme == "memory":
            raise InvalidLocation(f"{entry!r}: memory:// is test storage; use a path or s3://bucket/prefix")
        places.append(place.url)
    return tuple(places)


@dataclass(frozen=True)
class Resolved:
    """A restore location this replica may read: ``url`` to open; ``job``, when it lies inside the
    checkpoint storage, the job directory it is in ("" at the storage root); ``None`` when only an
    extra restore location admits it."""

    url: str
    job: str | None

    @property
    def in_checkpoint_storage(self) -> bool:
        return self.job is not None


class RestoreLocations:
    """The policy of where this replica may restore from: inside its own checkpoint storage, or under
    one of the extra allowed locations (``STATEHOUSE_RESTORE_LOCATIONS``); it resolves a location,
    refuses the others (``invalid_location``) and opens storage on what it checked."""

    def __init__(
        self,
        storage: CheckpointStorage,
        *,
        s3_endpoint_url: str | None = None,
        allowed: tuple[str, ...] = (),
        s3_timeouts: S3Timeouts | None = None,
    ) -> None:
        self.storage = storage
        self.s3_endpoint_url = s3_endpoint_url
        self.s3_timeouts = s3_timeouts
        self.root = parse_place(storage.location)
        self.allowed = tuple(parse_place(a) for a in allowed)

    def resolve(self, location: str) -> Resolved:
        """The normalized location and where it lies; ``invalid_location`` if this replica may not read it."""
        place = parse_place(location)
        if place.scheme == "memory" and self.root.scheme != "memory":
            raise InvalidLocation(
                f"memory:// locations are test storage; this replica's checkpoints are in {self.storage.location}"
            )
        relative = place.relative(self.root)
        if relative is not None:
            return Resolved(place.url, relative.split("/", 1)[0])
        if any(place.relative(prefix) is not None for prefix in self.allowed):
            return Resolved(place.url, None)
        others = ", ".join(p.url for p in self.allowed) or "none; STATEHOUSE_RESTORE_LOCATIONS adds some"
        raise InvalidLocation(
            f"restore locations must lie inside the checkpoint storage ({self.storage.location}) or under an "
            f"allowed restore location ({others}); got {location!r}"
        )

    def check(self, location: str) -> None:
        """Refuse a location this replica may not read (``invalid_location``)."""
        self.resolve(location)

    def open(self, location: str) -> CheckpointStorage:
        """Storage on the normalized location: what was checked is what is read."""
        return open_storage(
            self.resolve(location).url,
            s3_endpoint_url=self.s3_endpoint_url,
            s3_timeouts=self.s3_timeouts,
            transfer_threads=self.storage.transfer_threads,
        )
