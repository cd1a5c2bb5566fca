"""Checkpoint storage behind one interface: local directory, S3, memory."""

from __future__ import annotations

from urllib.parse import urlparse

from statehouse.snapshots.errors import InvalidLocation
from statehouse.snapshots.storage.base import DEFAULT_TRANSFER_THREADS, CheckpointOutputStream, CheckpointStorage
from statehouse.snapshots.storage.local import LocalStorage
from statehouse.snapshots.storage.memory import MemoryStorage
from statehouse.snapshots.storage.timeouts import S3Timeouts


def open_storage(
    location: str,
    *,
    s3_endpoint_url: str | None = None,
    s3_abandoned_upload_age_s: float | None = None,
    s3_timeouts: S3Timeouts | None = None,
    transfer_threads: int = DEFAULT_TRANSFER_THREADS,
) -> CheckpointStorage:
    """Storage for a location: a path, ``file:///path``, ``s3://bucket/prefix`` or ``memory://name/prefix``.

    ``s3_abandoned_upload_age_s``: how old an in-progress multipart upload must be before
    :meth:`~statehouse.snapshots.storage.s3.S3Storage.sweep_abandoned` aborts it (default 1 hour);
    ``s3_timeouts``: botocore's timeouts and attempts (:class:`S3Timeouts`' defaults);
    ``transfer_threads``: files a snapshot uploads or downloads at once.
    """
    if not isinstance(location, str) or not location.strip():
        raise InvalidLocation("a checkpoint location must be a non-empty path or URL")
    if "://" not in location:
        return LocalStorage(location, transfer_threads=transfer_threads)
    parsed = urlparse(location)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InvalidLocation(f"file locations must be local: file:///path, got {location!r}")
        return LocalStorage(parsed.path, transfer_threads=transfer_threads)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise InvalidLocation(f"an S3 location needs a bucket: s3://bucket/prefix, got {location!r}")
        # boto3 is imported only for S3 (a third of a second a process spends otherwise).
        from statehouse.snapshots.storage.s3 import DEFAULT_ABANDONED_UPLOAD_AGE_S, S3Storage

        age = DEFAULT_ABANDONED_UPLOAD_AGE_S if s3_abandoned_upload_age_s is None else s3_abandoned_upload_age_s
        return S3Storage(
            parsed.netloc,
            parsed.path,
            endpoint_url=s3_endpoint_url,
            abandoned_upload_age_s=age,
            timeouts=s3_timeouts,
            transfer_threads=transfer_threads,
        )
    if parsed.scheme == "memory":
        return MemoryStorage(parsed.netloc or "default", parsed.path, transfer_threads=transfer_threads)
    raise InvalidLocation(f"unsupported checkpoint location {location!r}: use a path, file://, s3:// or memory://")


__all__ = [
    "CheckpointOutputStream",
    "CheckpointStorage",
    "LocalStorage",
    "MemoryStorage",
    "S3Timeouts",
    "open_storage",
]
