"""Checkpoint storage in S3 or any S3-compatible server, through boto3.

Credentials come the standard AWS way (environment, config files, instance roles). Large
files go up in parts (boto3's managed transfer), partial reads are ranged GETs. A file is
durable once S3 confirmed the PUT (or the multipart completion); until then the key does
not exist, so a failed upload never leaves a half file behind a valid key.

A multipart upload that fails leaves its parts stored (and billed) until it is aborted.
boto3's transfer manager aborts once by itself, but when S3 is what failed its abort fails too
(logged at DEBUG, then dropped). So every failed upload is aborted here again (an error answer
with bounded retries); a key whose abort still fails is retried before the next upload, and
:meth:`S3Storage.sweep_abandoned` (at each start) aborts what a crashed process left behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import IO, Any

import boto3
from boto3.exceptions import Boto3Error
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.utils import parse_timestamp

from statehouse.snapshots.errors import InvalidLocation, StorageUnavailable
from statehouse.snapshots.handles import StreamHandle
from statehouse.snapshots.storage.base import (
    DEFAULT_TRANSFER_THREADS,
    CheckpointOutputStream,
    CheckpointStorage,
    file_handle,
)
from statehouse.snapshots.storage.timeouts import S3Timeouts

_PART = 8 << 20
_COPY_CHUNK = 1 << 20
_TRANSFER = TransferConfig(multipart_threshold=_PART, multipart_chunksize=_PART, max_concurrency=4)


def _client_config(timeouts: S3Timeouts, attempts: int | None = None, pool: int = 10) -> Config:
    """botocore's settings; ``attempts``: other than the timeouts' (aborts and the sweep retry in
    their own loop, with a bounded backoff, not in botocore's); ``pool``: connections kept open."""
    return Config(
        retries={"total_max_attempts": attempts or timeouts.attempts, "mode": "standard"},
        connect_timeout=timeouts.connect_s,
        read_timeout=timeouts.read_s,
        s3={"addressing_style": "path"},
        max_pool_connections=pool,
        # Every snapshot file carries its SHA-256, checked where it is read: S3's own checksums
        # (CRC32 on every PUT and GET by default since botocore 1.36) add CPU per request and
        # nothing to that, and some S3-compatible servers refuse their headers. Requests whose
        # API requires a checksum (DeleteObjects) still send one.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


def _timestamp(value: str) -> datetime:
    """A timestamp of an S3 answer (ISO 8601 in listings, an HTTP date in headers), as botocore's
    own parser reads it, without dateutil's general parser: that took two thirds of the CPU of
    listing a job's files (17-24 ms for 300 keys, 6.4 with this; bench/RESULTS.md §23)."""
    for parse in (datetime.fromisoformat, parsedate_to_datetime):
        try:
            parsed = parse(value)
        except (TypeError, ValueError):
            continue
        if parsed.tzinfo is not None:  # else botocore's reading of a time without a zone
            return parsed
    return parse_timestamp(value)


def _session() -> boto3.session.Session:
    """A boto3 session whose clients read S3's timestamps with :func:`_timestamp`."""
    session = boto3.session.Session()
    session._session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=_timestamp)
    return session


def _pool_connections(transfer_threads: int) -> int:
    """Connections for two snapshots at once (the checkpoint runner's threads), each moving
    ``transfer_threads`` files, each file in up to ``_TRANSFER``'s parts at once: past the pool,
    a request opens a connection of its own and closes it after (botocore's default is 10)."""
    return max(10, 2 * transfer_threads * _TRANSFER.max_concurrency)


_ABORT_PAUSES_S = (0.0, 0.25, 0.5, 1.0, 2.0)  # before each attempt to abort a failed upload: < 4 s in all
# S3 out of reach: no connection, or none of its answer in time (a timeout, a connection closed).
_UNREACHABLE = (BotoConnectionError, HTTPClientError)
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_NO_UPLOAD = {"NoSuchUpload", "404", "NotFound"}  # already aborted (e.g. by another replica's sweep)
DEFAULT_ABANDONED_UPLOAD_AGE_S = 3600
# The keys Statehouse writes, relative to the root (snapshots/layout.py): the sweep touches no
# other upload, so a bucket or prefix shared with other software keeps its uploads.
_SNAPSHOT_KEY = re.compile(r"^[^/]+/(?:chk-\d+|savepoints/sp-\d+|shared)/")

log = logging.getLogger(__name__)


# What a transfer (boto3's upload_file, download_file) raises when S3 fails it: botocore's errors, and
# boto3's own for an upload's error answer (S3UploadFailedError: a 500 mid-upload) or a download's
# retries spent (RetriesExceededError).
_TRANSFER_ERRORS = (BotoCoreError, ClientError, Boto3Error)


def _unavailable(action: str, exc: Exception) -> StorageUnavailable:
    return StorageUnavailable(f"checkpoint storage (S3) failed to {action}: {exc}")


class S3OutputStream(CheckpointOutputStream):
    """Spools to a temporary file (memory first), uploads on close."""

    def __init__(self, path: str, key: str, storage: S3Storage) -> None:
        super().__init__(path)
        self._key = key
        self._storage = storage
        self._spool = tempfile.SpooledTemporaryFile(max_size=_PART)  # noqa: SIM115 - closed in _commit/discard

    def _write(self, data: bytes) -> None:
        self._spool.write(data)

    def _commit(self) -> None:
        try:
            with self._storage._uploading(self._key, self._key):
                self._spool.seek(0)
                self._storage._upload(self._spool, self._key, self.tell())
        finally:
            self._spool.close()
        self._storage._count(written=self.tell())

    def discard(self) -> None:
        # Nothing reached S3 before _commit (the bytes are spooled locally), and a failed
        # _commit has aborted its multipart upload already.
        self._spool.close()


class S3Storage(CheckpointStorage):
    """Checkpoint storage in an S3 bucket under a prefix, through boto3: uploads (multipart for large
    files), ranged reads, listing and deletion, and the aborting of multipart uploads that failed
    or that a crashed process abandoned, so their parts are not kept and billed."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        client=None,
        abandoned_upload_age_s: float = DEFAULT_ABANDONED_UPLOAD_AGE_S,
        timeouts: S3Timeouts | None = None,
        transfer_threads: int = DEFAULT_TRANSFER_THREADS,
    ) -> None:
        super().__init__(transfer_threads)
        if not bucket:
            raise InvalidLocation("an S3 location needs a bucket: s3://bucket/prefix")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.location = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.abandoned_upload_age_s = abandoned_upload_age_s
        self.timeouts = timeouts or S3Timeouts()
        config = _client_config(self.timeouts, pool=_pool_connections(transfer_threads))
        self._client = client or _session().client("s3", endpoint_url=endpoint_url, config=config)
        self._housekeeping_client = client
        self._abort_lock = threading.Lock()
        self._unaborted: set[str] = set()  # keys of failed uploads whose abort failed too
        self.uploads_aborted = 0  # multipart uploads this storage aborted (failed ones and swept ones)

    def _key(self, path: str) -> str:
        joined = posixpath.normpath(posixpath.join(self.prefix, path))
        if joined.startswith(".."):
            raise InvalidLocation(f"path {path!r} leaves the bucket")
        return "" if joined == "." else joined

    def create_output(self, path: str) -> S3OutputStream:
        return S3OutputStream(path, self._key(path), self)

    def put_file(self, path: str, local_path: str) -> StreamHandle:
        # Hash locally first (files are immutable SSTs), then upload in one request or in parts.
        handle = file_handle(path, local_path)
        key = self._key(path)
        with self._uploading(key, path), open(local_path, "rb") as body:
            self._upload(body, key, handle.size)
        self._count(written=handle.size)
        return handle

    def _upload(self, body: IO[bytes], key: str, size: int) -> None:
        """One PUT below the multipart threshold: boto3's transfer manager costs ~1.6 ms more of
        the replica's CPU per file (3.3 against 1.7 ms for a small file, measured on SeaweedFS),
        and a checkpoint after every micro-batch uploads several small ones. Larger: in parts."""
        if size < _TRANSFER.multipart_threshold:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentLength=size)
        else:
            self._client.upload_fileobj(body, self.bucket, key, Config=_TRANSFER)

    # -- multipart uploads that failed or were abandoned ------------------------------------

    @property
    def _housekeeping(self):
        """The client for listing and aborting uploads, made on first use: no botocore retries
        (the abort loop paces its own), so a failure is reported within seconds."""
        with self._abort_lock:
            if self._housekeeping_client is None:
                session = _session()
                self._housekeeping_client = session.client(
                    "s3", endpoint_url=self.endpoint_url, config=_client_config(self.timeouts, attempts=1)
                )
            return self._housekeeping_client

    @contextmanager
    def _uploading(self, key: str, what: str) -> Iterator[None]:
        """Around one upload of ``key``: first retry earlier failed aborts; if this upload fails,
        abort its multipart upload before the error goes up (as ``StorageUnavailable``)."""
        self._retry_unaborted()
        try:
            yield
        except Exception as exc:
            self._abort_failed_upload(key)
            if isinstance(exc, _TRANSFER_ERRORS):
                raise _unavailable(f"upload {what}", exc) from exc
            raise

    def _abort_failed_upload(self, key: str) -> None:
        """Abort every in-progress multipart upload of ``key``, retrying an error answer with
        bounded backoff. S3 out of reach (no connection, no answer in time) is not retried here:
        the upload's error goes up at once rather than after the same wait again per attempt, and
        the abort is retried before the next upload and by the sweep at the next start.

        Every key is written by one upload attempt only (``chk-<id>/replica-<i>-of-<n>/...``,
        ``shared/<uuid>-...``; ids never repeat), so any upload of it is the one that failed.
        Never raises: the upload's own error is the one to report.
        """
        error: Exception | None = None
        for pause in _ABORT_PAUSES_S:
            time.sleep(pause)
            try:
                self._abort_uploads_of(key)
                return
            except _UNREACHABLE as exc:
                error = exc
                break
            except (BotoCoreError, ClientError) as exc:
                error = exc
        with self._abort_lock:
            self._unaborted.add(key)
        log.warning(
            "could not abort the multipart upload of s3://%s/%s after it failed (%s); retrying before the "
            "next upload, and the sweep at start aborts it once older than STATEHOUSE_S3_ABANDONED_UPLOAD_AGE_S",
            self.bucket,
            key,
            error,
        )

    def _abort_uploads_of(self, key: str) -> int:
        found = [u for u in self._list_uploads(key) if u["Key"] == key]
        for upload in found:
            self._abort(upload)
        if found:
            log.info("aborted %d multipart upload(s) of s3://%s/%s after a failed upload", len(found), self.bucket, key)
        return len(found)

    def _retry_unaborted(self) -> int:
        """One more try for each key whose abort failed; stops at the first failure (S3 still away)."""
        with self._abort_lock:
            keys, self._unaborted = sorted(self._unaborted), set()
        aborted = 0
        for i, key in enumerate(keys):
            try:
                aborted += self._abort_uploads_of(key)
            except (BotoCoreError, ClientError):
                with self._abort_lock:
                    self._unaborted.update(keys[i:])
                break
        return aborted

    def _list_uploads(self, prefix: str) -> list[dict[str, Any]]:
        """In-progress multipart uploads whose key starts with ``prefix`` (all pages, then abort:
        aborting while paging could shift the markers)."""
        paginator = self._housekeeping.get_paginator("list_multipart_uploads")
        return [u for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix) for u in page.get("Uploads", ())]

    def _abort(self, upload: dict[str, Any]) -> None:
        try:
            self._housekeeping.abort_multipart_upload(
                Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in _NO_UPLOAD:
                raise
        with self._abort_lock:
            self.uploads_aborted += 1

    def sweep_abandoned(self, initiated_before: datetime | None = None) -> int:
        """Abort the multipart uploads a failed or killed process left under this storage's root.

        Only uploads started more than ``abandoned_upload_age_s`` ago (or before
        ``initiated_before``), and only of keys in Statehouse's layout, are aborted. The age
        is what keeps a live upload safe: all replicas write under one root, and the large
        files — SSTs in ``<job>/shared/`` — carry no replica in their names, so a replica
        cannot tell its own uploads from another replica's by key. Uploads this process
        failed to abort are aborted whatever their age. Never raises (S3 may be away at start).
        """
        aborted = self._retry_unaborted()
        cutoff = initiated_before or datetime.now(UTC) - timedelta(seconds=self.abandoned_upload_age_s)
        root = self.prefix + "/" if self.prefix else ""
        failed = 0
        error: Exception | None = None
        try:
            uploads = self._list_uploads(root)
        except (BotoCoreError, ClientError) as exc:
            log.warning("could not list abandoned multipart uploads in %s: %s", self.location, exc)
            return aborted
        for upload in uploads:
            if upload["Initiated"] > cutoff or not _SNAPSHOT_KEY.match(upload["Key"][len(root) :]):
                continue
            try:
                self._abort(upload)
                aborted += 1
            except (BotoCoreError, ClientError) as exc:
                failed, error = failed + 1, exc
        log.log(
            logging.WARNING if failed else logging.INFO,
            "swept %s: aborted %d abandoned multipart upload(s) started before %s%s",
            self.location,
            aborted,
            cutoff.isoformat(timespec="seconds"),
            f"; {failed} could not be aborted ({error})" if failed else "",
        )
        return aborted

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        if length == 0:
            return b""
        kwargs = {}
        if offset or length is not None:
            kwargs["Range"] = f"bytes={offset}-" + ("" if length is None else str(offset + length - 1))
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=self._key(path), **kwargs)["Body"]
            data = body.read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _NOT_FOUND:
                raise FileNotFoundError(path) from None
            if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""
            raise _unavailable(f"read {path}", exc) from exc
        except BotoCoreError as exc:
            raise _unavailable(f"read {path}", exc) from exc
        self._count(read=len(data))
        return data

    def download(self, path: str, local_path: str, size: int | None = None) -> None:
        try:
            if size is not None and size < _TRANSFER.multipart_threshold:
                # One GET streamed to the file: boto3's transfer manager costs 2-3 ms more of the
                # replica's CPU per file (a move's or a restore's load fetches many small ones).
                self._get_to(self._key(path), local_path)
            else:
                self._client.download_file(self.bucket, self._key(path), local_path, Config=_TRANSFER)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _NOT_FOUND:
                raise FileNotFoundError(path) from None
            raise _unavailable(f"download {path}", exc) from exc
        except (BotoCoreError, Boto3Error) as exc:
            raise _unavailable(f"download {path}", exc) from exc
        self._count(read=os.path.getsize(local_path))

    def _get_to(self, key: str, local_path: str) -> None:
        body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"]
        try:
            with open(local_path, "wb") as target:
                shutil.copyfileobj(body, target, _COPY_CHUNK)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(local_path)  # no half file left to mistake for the whole
            raise
        finally:
            body.close()

    def list(self, prefix: str) -> list[str]:
        base = self._key(prefix)
        base = base + "/" if base else ""
        found: list[str] = []
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
                found.extend(obj["Key"] for obj in page.get("Contents", ()))
        except (BotoCoreError, ClientError) as exc:
            raise _unavailable(f"list {prefix}", exc) from exc
        root = self.prefix + "/" if self.prefix else ""
        return sorted(posixpath.relpath(k, root) if root else k for k in found)

    def exists(self, path: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._key(path))
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _NOT_FOUND:
                return False
            raise _unavailable(f"check {path}", exc) from exc
        except BotoCoreError as exc:
            raise _unavailable(f"check {path}", exc) from exc

    def delete(self, paths: Iterable[str]) -> None:
        keys = [self._key(p) for p in paths]
        try:
            for i in range(0, len(keys), 1000):  # the DeleteObjects limit
                batch = [{"Key": k} for k in keys[i : i + 1000]]
                self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
        except (BotoCoreError, ClientError) as exc:
            raise _unavailable("delete files", exc) from exc

    def close(self) -> None:
        self._retry_unaborted()
        self._client.close()
        if self._housekeeping_client is not None:
            self._housekeeping_client.close()
