"""Multipart uploads on a real S3 server (SeaweedFS) are never left behind: a failed upload is
aborted (again, after S3 comes back), and the sweep at start aborts old abandoned ones only.

The outages are real: a botocore ``before-send`` hook kills the SeaweedFS process as the
upload's second part is about to go out, so the upload has started (its parts are stored) and
then every request fails, boto3's own abort included.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import EndpointConnectionError

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.heap import HeapStore
from statehouse.snapshots.errors import StorageUnavailable
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.storage.s3 import S3Storage
from statehouse.snapshots.storage.timeouts import S3Timeouts
from statehouse.snapshots.stored.descriptors import StateDescriptor
from tests.support.job_contents import dump

pytestmark = [pytest.mark.s3, pytest.mark.slow]  # each stops and starts S3 mid-upload

BIG = 20 << 20  # three 8 MiB parts
# The storages S3 is taken from fail at the first refused connection instead of after botocore's
# backoff (seconds at random): what is tested is what is left behind, not how long retries take.
ONE_ATTEMPT = S3Timeouts(attempts=1)


def uploads(s3_server, prefix: str) -> list[dict]:
    """In-progress multipart uploads under ``prefix``, straight from the server."""
    client = s3_server.client()
    pages = client.get_paginator("list_multipart_uploads").paginate(Bucket=s3_server.bucket, Prefix=prefix)
    return [u for page in pages for u in page.get("Uploads", ())]


def stop_s3_at_second_part(storage: S3Storage, s3_server) -> threading.Event:
    """Kill the server (once) just before the storage's client sends an upload's second part."""
    parts, stopped, lock = [0], threading.Event(), threading.Lock()

    def before_send(**_kwargs):
        with lock:
            parts[0] += 1
            if parts[0] == 2:
                s3_server.kill()
                stopped.set()

    storage._client.meta.events.register("before-send.s3.UploadPart", before_send)
    return stopped


def split(location: str) -> tuple[str, str]:
    bucket, prefix = location[len("s3://") :].split("/", 1)
    return bucket, prefix


def test_a_file_upload_cut_by_an_outage_is_aborted_when_s3_is_back(s3_server, s3_location, tmp_path):
    bucket, prefix = split(s3_location)
    storage = S3Storage(bucket, prefix, endpoint_url=s3_server.endpoint, timeouts=ONE_ATTEMPT)
    source = tmp_path / "000042.sst"
    source.write_bytes(os.urandom(BIG))
    stopped = stop_s3_at_second_part(storage, s3_server)
    try:
        with pytest.raises(StorageUnavailable, match="S3"):
            storage.put_file("orders/shared/u1-000042.sst", str(source))
        assert stopped.is_set()
    finally:
        s3_server.start()
    # S3 was away for boto3's abort and for ours: the parts are still stored...
    key = f"{prefix}/orders/shared/u1-000042.sst"
    assert [u["Key"] for u in uploads(s3_server, prefix + "/")] == [key]
    # ...until the storage's next chance (here the sweep; the next upload does the same),
    # whatever the upload's age: this process knows it failed.
    assert storage.sweep_abandoned() == 1
    assert uploads(s3_server, prefix + "/") == []
    assert storage.uploads_aborted == 1 and storage.list("orders") == []
    storage.close()


def test_a_failed_upload_is_aborted_at_once_while_s3_is_up(s3_server, s3_location):
    """A part that fails for another reason than an outage (here the data source breaks)."""
    bucket, prefix = split(s3_location)
    storage = S3Storage(bucket, prefix, endpoint_url=s3_server.endpoint)

    class Broken(Exception):
        pass

    def broken_source(**kwargs):
        if kwargs["params"].get("PartNumber") == 2:
            raise Broken("the source went away")

    storage._client.meta.events.register("before-parameter-build.s3.UploadPart", broken_source)
    with pytest.raises(Broken), storage.create_output("orders/chk-1/replica-0-of-1/keyed.bin") as out:
        out.write(os.urandom(BIG))
        out.close_and_get_handle()
    assert uploads(s3_server, prefix + "/") == [] and storage.list("orders") == []
    storage.close()


@pytest.mark.parametrize("door", ["put_file", "create_output"])
def test_an_error_answer_to_a_part_is_the_storages_error_and_aborted(s3_server, s3_location, tmp_path, door):
    """S3 answers a part with a 500 (as SeaweedFS does while it stops): boto3's file upload raises
    its own S3UploadFailedError for it, which must reach the caller as the storage's error (a
    checkpoint's clear "checkpoint storage (S3) failed"), and the upload is aborted."""
    bucket, prefix = split(s3_location)
    storage = S3Storage(bucket, prefix, endpoint_url=s3_server.endpoint, timeouts=ONE_ATTEMPT)
    storage._client.meta.events.register("before-send.s3.UploadPart", internal_error_to_part_2(lambda: True))
    source = tmp_path / "000044.sst"
    source.write_bytes(os.urandom(BIG))
    with pytest.raises(StorageUnavailable, match=r"checkpoint storage \(S3\) failed to upload .*InternalError"):
        if door == "put_file":
            storage.put_file("orders/shared/u4-000044.sst", str(source))
        else:
            with storage.create_output("orders/chk-1/replica-0-of-1/keyed.bin") as out:
                out.write(source.read_bytes())
                out.close_and_get_handle()
    assert uploads(s3_server, prefix + "/") == [] and storage.list("orders") == []
    storage.close()


def test_an_abort_that_cannot_reach_s3_is_not_retried_before_the_error_goes_up(s3_server, s3_location, tmp_path):
    """The upload failed and S3 is out of reach for its abort too: one try, then the upload's error
    (a wait per retry would only hold it back); the next upload aborts it first."""
    bucket, prefix = split(s3_location)
    storage = S3Storage(bucket, prefix, endpoint_url=s3_server.endpoint, timeouts=ONE_ATTEMPT)
    failing, tries = [True], Counter()

    def unreachable(request, event_name, **_kwargs):
        if failing[0]:
            tries[event_name.rsplit(".", 1)[1]] += 1
            raise EndpointConnectionError(endpoint_url=request.url)

    storage._client.meta.events.register("before-send.s3.UploadPart", internal_error_to_part_2(lambda: failing[0]))
    storage._client.meta.events.register("before-send.s3.AbortMultipartUpload", unreachable)  # boto3's own abort
    storage._housekeeping.meta.events.register("before-send.s3.ListMultipartUploads", unreachable)
    source = tmp_path / "000045.sst"
    source.write_bytes(os.urandom(BIG))
    with pytest.raises(StorageUnavailable, match="InternalError"):
        storage.put_file("orders/shared/u5-000045.sst", str(source))
    assert tries["ListMultipartUploads"] == 1
    assert len(uploads(s3_server, prefix + "/")) == 1  # not aborted yet
    failing[0] = False  # S3 reachable again: the next upload aborts the left-over one first
    storage.put_file("orders/shared/u6-000046.sst", str(source))
    assert uploads(s3_server, prefix + "/") == [] and storage.uploads_aborted == 1
    storage.close()


def internal_error_to_part_2(answering: Callable[[], bool]) -> Callable[..., AWSResponse | None]:
    """A ``before-send`` hook: while ``answering()``, S3's answer to an upload's part 2 is a 500
    ``InternalError`` (as SeaweedFS gives while it stops); every other request goes out."""

    def hook(request, **_kwargs):
        if answering() and "partNumber=2" in request.url:
            body = b"<Error><Code>InternalError</Code><Message>We encountered an internal error</Message></Error>"
            return AWSResponse(request.url, 500, {}, RawBody(body))
        return None

    return hook


class RawBody(io.BytesIO):
    """An answer's body as botocore reads it (``stream()``, ``read()``)."""

    def stream(self, **_kwargs):
        yield self.getvalue()


def test_the_sweep_aborts_old_abandoned_uploads_only(s3_server, s3_location):
    bucket, prefix = split(s3_location)
    client = s3_server.client()

    def start_upload(key: str) -> None:
        upload = client.create_multipart_upload(Bucket=bucket, Key=key)
        client.upload_part(Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * (5 << 20))

    old = f"{prefix}/orders/shared/u1-000007.sst"
    not_ours = f"{prefix}/exports/report.csv"  # not in Statehouse's layout
    other_root = f"{prefix}-other/orders/shared/u2-000007.sst"  # another storage root
    for key in (old, not_ours, other_root):
        start_upload(key)
    time.sleep(1.5)  # S3 reports Initiated to the second: the fresh upload starts a second later
    fresh = f"{prefix}/orders/chk-9/replica-1-of-2/keyed.bin"  # e.g. another replica's live upload
    start_upload(fresh)
    initiated = {u["Key"]: u["Initiated"] for u in uploads(s3_server, prefix)}
    assert initiated[fresh] > initiated[old]
    between = initiated[old] + (initiated[fresh] - initiated[old]) / 2

    storage = open_storage(s3_location, s3_endpoint_url=s3_server.endpoint)
    assert isinstance(storage, S3Storage)
    assert storage.sweep_abandoned() == 0  # nothing is an hour old (the default age)
    assert storage.sweep_abandoned(initiated_before=between) == 1
    assert sorted(u["Key"] for u in uploads(s3_server, prefix)) == sorted([not_ours, other_root, fresh])

    # the setting, through open_storage and the manager's start: age 0 sweeps every upload
    # started before now (safe only with a single writer; the default keeps an hour)
    catalog = JobCatalog(HeapStore())
    from statehouse.backends.checkpointing.manager import CheckpointManager

    storage = open_storage(s3_location, s3_endpoint_url=s3_server.endpoint, s3_abandoned_upload_age_s=0)
    CheckpointManager(catalog, storage).close()
    assert sorted(u["Key"] for u in uploads(s3_server, prefix)) == sorted([not_ours, other_root])
    assert storage.uploads_aborted == 1
    for upload in uploads(s3_server, prefix):  # leave the shared bucket clean
        client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    storage.close()
    catalog.close()


def test_a_checkpoint_cut_by_an_outage_leaves_no_upload_and_the_next_one_restores(make_manager, s3_server, s3_location):
    catalog = JobCatalog(
        HeapStore(incremental_checkpoints=False)
    )  # full format: keyed.bin goes up as one multipart stream
    job, _ = catalog.create("orders", 8)
    job.register_state(StateDescriptor("v", "value"))
    with job.transaction() as tx:
        for i in range(24):
            tx.value("v").update(f"k{i}", os.urandom(450_000).hex())  # ~21 MB
    bucket, prefix = split(s3_location)
    storage = S3Storage(bucket, prefix, endpoint_url=s3_server.endpoint, timeouts=ONE_ATTEMPT)
    manager = make_manager(catalog, storage, compression="none")
    manager.trigger("orders", 1)
    assert manager.complete("orders", 1).status == "completed"
    expected = dump(job)

    stopped = stop_s3_at_second_part(storage, s3_server)
    try:
        manager.trigger("orders", 2)
        info = manager.wait("orders", 2, 60)
        assert stopped.is_set() and info.status == "failed" and "S3" in info.error
    finally:
        s3_server.start()
    left = uploads(s3_server, prefix + "/")
    assert [u["Key"] for u in left] == [f"{prefix}/orders/chk-2/replica-0-of-1/keyed.bin"]

    with job.transaction() as tx:
        tx.value("v").update("k1", "changed")
    # the next checkpoint's first upload aborts the one left over, and it completes
    assert manager.trigger("orders", 3).checkpoint_id == 3
    assert manager.complete("orders", 3).status == "completed"
    assert uploads(s3_server, prefix + "/") == []
    manager.restore("orders", 1)
    assert dump(catalog.get("orders")) == expected
    catalog.close()
    storage.close()


def test_a_restarted_replica_sweeps_what_a_killed_one_left(s3_server, s3_location, tmp_path):
    """A process that died mid-upload aborts nothing: the next start's sweep does, once the
    upload is older than the age (here every upload before the sweep's own start)."""
    bucket, prefix = split(s3_location)
    storage = S3Storage(bucket, prefix, endpoint_url=s3_server.endpoint, timeouts=ONE_ATTEMPT)
    source = tmp_path / "000043.sst"
    source.write_bytes(os.urandom(BIG))
    stop_s3_at_second_part(storage, s3_server)
    try:
        with pytest.raises(StorageUnavailable):
            storage.put_file("orders/shared/u3-000043.sst", str(source))
    finally:
        s3_server.start()
    # the process is gone (its memory of the failed abort with it): a new one starts
    assert len(uploads(s3_server, prefix + "/")) == 1
    restarted = S3Storage(bucket, prefix, endpoint_url=s3_server.endpoint)
    started = uploads(s3_server, prefix + "/")[0]["Initiated"]
    assert restarted.sweep_abandoned(initiated_before=started - timedelta(seconds=1)) == 0
    assert restarted.sweep_abandoned(initiated_before=started + timedelta(seconds=1)) == 1
    assert uploads(s3_server, prefix + "/") == []
    restarted.close()
