"""Checkpoint storage in S3 or any S3-compatible server, through boto3.

Credentials come the standard AWS way (environment, config files, instance roles). Large
files go up in parts (boto3's managed transfer), partial reads are ranged GETs. A file is
durable once S3 confirmed the PUT (or the multipart completion); until then the key does
not exist, so a failed upload never leaves a half file behind a valid key.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from collections.abc import Iterable

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from statehouse.snapshots.errors import InvalidLocation, StorageUnavailable
from statehouse.snapshots.handles import StreamHandle
from statehouse.snapshots.storage.base import CheckpointOutputStream, CheckpointStorage, file_handle

_PART = 8 << 20
_TRANSFER = TransferConfig(multipart_threshold=_PART, multipart_chunksize=_PART, max_concurrency=4)
# Fail fast: a checkpoint that cannot reach S3 is reported failed, the next one retries.
_CLIENT_CONFIG = Config(
    retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=30, s3={"addressing_style": "path"}
)
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}


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
            self._spool.seek(0)
            self._storage._client.upload_fileobj(self._spool, self._storage.bucket, self._key, Config=_TRANSFER)
        except (BotoCoreError, ClientError) as exc:
            raise _unavailable(f"upload {self._key}", exc) from exc
        finally:
            self._spool.close()
        self._storage._count(written=self.tell())

    def discard(self) -> None:
        self._spool.close()


class S3Storage(CheckpointStorage):
    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, client=None) -> None:
        super().__init__()
        if not bucket:
            raise InvalidLocation("an S3 location needs a bucket: s3://bucket/prefix")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.location = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self._client = client or boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=_CLIENT_CONFIG)

    def _key(self, path: str) -> str:
        joined = posixpath.normpath(posixpath.join(self.prefix, path))
        if joined.startswith(".."):
            raise InvalidLocation(f"path {path!r} leaves the bucket")
        return "" if joined == "." else joined

    def create_output(self, path: str) -> S3OutputStream:
        return S3OutputStream(path, self._key(path), self)

    def put_file(self, path: str, local_path: str) -> StreamHandle:
        # Hash locally first (files are immutable SSTs), then let boto3 choose single or multipart.
        handle = file_handle(path, local_path)
        try:
            self._client.upload_file(local_path, self.bucket, self._key(path), Config=_TRANSFER)
        except (BotoCoreError, ClientError) as exc:
            raise _unavailable(f"upload {path}", exc) from exc
        self._count(written=handle.size)
        return handle

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

    def download(self, path: str, local_path: str) -> None:
        try:
            self._client.download_file(self.bucket, self._key(path), local_path, Config=_TRANSFER)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _NOT_FOUND:
                raise FileNotFoundError(path) from None
            raise _unavailable(f"download {path}", exc) from exc
        except BotoCoreError as exc:
            raise _unavailable(f"download {path}", exc) from exc
        self._count(read=os.path.getsize(local_path))

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
        self._client.close()
