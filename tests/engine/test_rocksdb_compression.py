"""How a job's RocksDB compresses its table files (``STATEHOUSE_ROCKSDB_COMPRESSION``,
``TableFiles.compression``): every file written records the algorithm RocksDB used, a change applies to
the files written from then on, and files written another way stay readable."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from statehouse.backends.base.partition import WriteOp
from statehouse.backends.rocksdb import RocksDBPartition, RocksDBStore, TableFiles
from tests.support.server import start_server

KEYS = 5_000
VALUE = b"a compressible value " * 10
# The name RocksDB records in a table file's properties block (``rocksdb.compression``), whose
# keys are stored prefix-compressed: the key's end, "ression", sits right before its value.
RECORDED = {"none": b"NoCompression", "lz4": b"LZ4", "zstd": b"ZSTD", "snappy": b"Snappy"}


def _write(partition: RocksDBPartition, first: int) -> None:
    ops = [WriteOp("put", "s", k % 128, b"key-%06d" % k, value=VALUE) for k in range(first, first + KEYS)]
    partition.write(ops)
    partition.flush()  # into a table file


def _files(directory: Path) -> dict[str, bytes]:
    """Each table file's name and the compression it records."""
    found = {}
    for path in directory.glob("*.sst"):
        data = path.read_bytes()
        [name] = [name for name in RECORDED.values() if b"ression" + name in data]
        found[path.name] = name
    return found


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd", "snappy"])
def test_table_files_are_written_with_the_compression_set(tmp_path, compression):
    store = RocksDBStore(str(tmp_path), files=TableFiles(compression=compression))
    partition = store.open_partition("j", 128)
    partition.create_table("s", False)
    _write(partition, 0)
    files = _files(tmp_path / "j")
    assert files and set(files.values()) == {RECORDED[compression]}
    size = sum((tmp_path / "j" / name).stat().st_size for name in files)
    raw = KEYS * len(VALUE)
    assert size > raw if compression == "none" else size < raw / 4  # the values repeat: any algorithm shrinks them
    assert partition.get("s", 7 % 128, b"key-000007") == VALUE
    partition.close()


def test_a_change_applies_to_new_files_and_the_old_ones_stay_readable(tmp_path):
    partition = RocksDBStore(str(tmp_path), files=TableFiles(compression="lz4")).open_partition("j", 128)
    partition.create_table("s", False)
    _write(partition, 0)
    before = _files(tmp_path / "j")
    partition.close()

    partition = RocksDBStore(str(tmp_path), files=TableFiles(compression="none")).open_partition("j", None)
    _write(partition, KEYS)
    after = _files(tmp_path / "j")
    assert {after[name] for name in before} == {b"LZ4"}  # not rewritten by the reopen
    assert {after[name] for name in set(after) - set(before)} == {b"NoCompression"}
    keys = [0, KEYS - 1, KEYS, 2 * KEYS - 1]
    assert partition.get_many("s", [k % 128 for k in keys], [b"key-%06d" % k for k in keys]) == [VALUE] * 4
    partition.close()


def test_a_restores_staged_database_is_written_with_it_too(tmp_path):
    store = RocksDBStore(str(tmp_path), files=TableFiles(compression="zstd"))
    staged = store.open_staging("j", 128)
    staged.create_table("s", False)
    _write(staged, 0)
    files = _files(Path(staged.path))
    assert files and set(files.values()) == {b"ZSTD"}
    store.discard_staging("j", staged)


def test_an_unknown_compression_is_refused():
    with pytest.raises(ValueError, match="compression must be one of lz4, zstd, snappy, none; got 'gzip'"):
        TableFiles(compression="gzip")


@pytest.mark.http
def test_the_server_writes_its_jobs_files_with_the_setting(tmp_path):
    server = start_server(tmp_path, {"STATEHOUSE_BACKEND": "rocksdb", "STATEHOUSE_ROCKSDB_COMPRESSION": "none"})
    try:
        http = httpx.Client(base_url=server.url, timeout=30)
        http.put("/v1/jobs/j", json={"max_parallelism": 128}).raise_for_status()
        http.put("/v1/jobs/j/states/s", json={"kind": "value"}).raise_for_status()
        body = {"ops": [{"op": "put", "state": "s", "key": f"k{i}", "value": "x" * 200} for i in range(500)]}
        http.post("/v1/jobs/j/batch", json=body).raise_for_status()
        http.post("/v1/jobs/j/checkpoints", json={"checkpoint_id": 1}).raise_for_status()  # flushes
    finally:
        server.stop()
    files = _files(tmp_path / "data" / "j")
    assert files and set(files.values()) == {b"NoCompression"}
