"""RocksDB's table cache keeps the table files a job reads open (backends/rocksdb/database.py,
``db_options``): a point read of a file whose reader was evicted opens it again, reading its index
and Bloom filter (for a file of a million keys ~1.5 MB read, checksummed and parsed per read)."""

from __future__ import annotations

import re

from rocksdict import Rdict

from statehouse.backends.rocksdb.database import MAX_OPEN_FILES, db_options

# Table files in the test: well below what the table cache holds (MAX_OPEN_FILES less the ten
# RocksDB keeps for other files), many more than the 2-3 two states' reads touch in a job.
FILES = 40


def _file_opens(options) -> int:
    found = re.search(r"rocksdb\.no\.file\.opens COUNT : (\d+)", options.get_statistics() or "")
    assert found, "RocksDB's statistics name no file opens"
    return int(found.group(1))


def test_reads_across_many_table_files_open_each_file_once(tmp_path):
    """Reads cycling over FILES table files (one per column family, as a job's states are) never
    open one twice: RocksDB's default 64 shards would split the cache into shards of one file
    each, and two files hashed to one shard evict each other on every read (measured: a million-key
    state's point reads 20-50x slower, the Spark job's micro-batch staging 10-15 s instead of 0.7)."""
    assert FILES < MAX_OPEN_FILES - 10
    options = db_options()
    options.enable_statistics()
    families = [f"state-{i}" for i in range(FILES)]
    db = Rdict(str(tmp_path / "db"), options, column_families={name: db_options() for name in families})
    try:
        states = [db.get_column_family(name) for name in families]
        for state in states:  # one table file each
            for k in range(100):
                state.put(b"key-%03d" % k, b"value")
            state.flush()
        for state in states:  # every file read once: open now
            assert state.get(b"key-000") == b"value"
        opened = _file_opens(options)
        for k in range(1, 30):
            for state in states:
                assert state.get(b"key-%03d" % k) == b"value"
        assert _file_opens(options) == opened, "a table file was opened again: the table cache evicted it"
    finally:
        db.close()
