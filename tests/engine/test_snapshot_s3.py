"""Checkpoints on a real S3 server (SeaweedFS): round trip, ranged reads, multipart, outages."""

from __future__ import annotations

import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.heap import HeapStore
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.snapshots.errors import SnapshotCorrupt
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.storage.s3 import S3Storage
from statehouse.snapshots.storage.timeouts import S3Timeouts
from tests.support.gated import data_sections, gated
from tests.support.job_contents import dump, operator_dump, populate

pytestmark = [pytest.mark.s3]


@pytest.mark.parametrize("incremental", [True, False])
def test_round_trip_on_s3(make_catalog, make_manager, s3_server, s3_location, incremental):
    catalog = make_catalog(incremental=incremental)
    job, _ = catalog.create("orders", 128)
    populate(job, 300)
    expected, expected_ops = dump(job), operator_dump(job)
    storage = open_storage(s3_location, s3_endpoint_url=s3_server.endpoint)
    manager = make_manager(catalog, storage)
    manager.trigger("orders", 1)
    info = manager.complete("orders", 1)
    assert info.location == f"{s3_location}/orders/chk-1"
    with job.transaction() as tx:
        tx.value("v").update("k1", "changed")
    manager.restore("orders", 1)
    assert dump(catalog.get("orders")) == expected and operator_dump(catalog.get("orders")) == expected_ops

    # a savepoint restores from its location string into another replica layout
    manager.trigger("orders", 2, kind="savepoint")
    location = manager.complete("orders", 2).location
    half = JobCatalog(HeapStore(), replica_index=1, replica_count=2)
    make_manager(half, storage, s3_endpoint_url=s3_server.endpoint).restore("orders", location=location)
    assert dump(half.get("orders")) == {k: v for k, v in expected.items() if k[1] >= 64}


def test_ranged_reads_and_multipart(s3_server, s3_location):
    storage = open_storage(s3_location, s3_endpoint_url=s3_server.endpoint)
    assert isinstance(storage, S3Storage)
    big = bytes(range(256)) * (40 * 4096 + 3)  # ~40 MB: multipart upload
    with storage.create_output("x/big.bin") as out:
        for i in range(0, len(big), 1 << 20):
            out.write(big[i : i + (1 << 20)])
        handle = out.close_and_get_handle()
    assert handle.size == len(big)
    before, requests = storage.bytes_read, storage.reads
    assert storage.read("x/big.bin", 1000, 10) == big[1000:1010]
    assert storage.bytes_read - before == 10
    assert storage.read_verified(handle) == big
    assert storage.reads - requests == 2  # one request each (what a restore's read count counts)
    assert storage.list("x") == ["x/big.bin"] and storage.exists("x/big.bin")
    storage.delete(["x/big.bin"])
    assert storage.list("x") == []
    with pytest.raises(SnapshotCorrupt, match="missing"):
        storage.read_verified(handle)


@pytest.mark.slow
def test_s3_outage_fails_the_checkpoint_and_keeps_the_previous(make_manager, s3_server, s3_location, tmp_path):
    catalog = JobCatalog(RocksDBStore(str(tmp_path / "data")))
    job, _ = catalog.create("orders", 128)
    populate(job, 200)
    expected = dump(job)
    bucket, prefix = s3_location[len("s3://") :].split("/", 1)
    # the keyed and operator files wait for the gate, so the test can pull S3 away mid-upload
    # one attempt per request: the checkpoint fails at the first refused connection, not after
    # botocore's backoff (seconds at random)
    storage = gated(
        S3Storage, bucket, prefix, endpoint_url=s3_server.endpoint, gates=data_sections, timeouts=S3Timeouts(attempts=1)
    )
    storage.gate.set()
    manager = make_manager(catalog, storage)
    manager.trigger("orders", 1)
    manager.complete("orders", 1)

    with job.transaction() as tx:
        tx.value("v").update("k1", "newer")
    storage.gate.clear()
    manager.trigger("orders", 2)
    s3_server.kill()  # S3 goes away while checkpoint 2 is uploading
    try:
        storage.gate.set()
        info = manager.wait("orders", 2, 60)
        assert info.status == "failed" and "S3" in info.error
    finally:
        s3_server.start()
    assert manager.get("orders", 1).status == "completed"
    manager.restore("orders", 1)
    assert dump(catalog.get("orders")) == expected
    assert manager.trigger("orders").checkpoint_id == 3  # and checkpointing goes on
    assert manager.complete("orders", 3).status == "completed"
    catalog.close()


def test_downloads_count_as_bytes_read(s3_server, s3_location, tmp_path):
    from statehouse.snapshots.storage import open_storage

    storage = open_storage(s3_location, s3_endpoint_url=s3_server.endpoint)
    source = tmp_path / "f.sst"
    source.write_bytes(b"x" * 12345)
    storage.put_file("shared/f.sst", str(source))
    before = storage.bytes_read
    storage.download("shared/f.sst", str(tmp_path / "copy.sst"))
    assert storage.bytes_read - before == 12345


def test_small_files_move_in_one_request_and_large_ones_in_parts(s3_server, s3_location, tmp_path):
    """A file under the multipart threshold goes up in one PUT and comes down in one GET (the
    files of a checkpoint per micro-batch, the table files a load fetches); a larger one in parts.
    Either way the bytes are the file's, and a missing one is reported, with nothing left behind."""
    storage = open_storage(s3_location, s3_endpoint_url=s3_server.endpoint)
    assert isinstance(storage, S3Storage)
    handles = {}
    for name, size in (("small.sst", 123_457), ("large.sst", 9 << 20)):
        source = tmp_path / name
        source.write_bytes(bytes(range(256)) * (size // 256) + b"!" * (size % 256))
        handles[name] = storage.put_file(f"shared/{name}", str(source))
        etag = storage._client.head_object(Bucket=storage.bucket, Key=storage._key(f"shared/{name}"))["ETag"]
        assert ("-" in etag) == (name == "large.sst"), f"{name}: ETag {etag}"  # a multipart upload's has '-<parts>'
        copy = tmp_path / f"copy-{name}"
        storage.download_verified(handles[name], str(copy))
        assert copy.read_bytes() == source.read_bytes()
    with storage.create_output("x/stream.bin") as out:
        out.write(b"operator state" * 1000)
        streamed = out.close_and_get_handle()
    assert storage.read_verified(streamed) == b"operator state" * 1000
    storage.delete(["shared/small.sst"])
    with pytest.raises(SnapshotCorrupt, match="missing"):
        storage.download_verified(handles["small.sst"], str(tmp_path / "gone.sst"))
    assert not (tmp_path / "gone.sst").exists()


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-30T18:45:00.000Z",  # a listing's LastModified
        "2026-11-30T18:45:00Z",
        "Mon, 30 Nov 2026 18:45:00 GMT",  # a header's Last-Modified
        "2026-11-30T18:45:00.123456+02:00",
        "2026-11-30T18:45:00",  # no zone: botocore's own reading
        "1700000000",  # epoch seconds
    ],
)
def test_s3_timestamps_read_as_botocore_reads_them(value):
    """The storage's clients read S3's timestamps without dateutil (two thirds of a listing's CPU),
    to the same instants botocore's parser gives."""
    from botocore.utils import parse_timestamp

    from statehouse.snapshots.storage.s3 import _timestamp

    ours, botocores = _timestamp(value), parse_timestamp(value)
    assert ours == botocores and (ours.tzinfo is None) == (botocores.tzinfo is None)
