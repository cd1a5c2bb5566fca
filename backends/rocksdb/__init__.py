"""RocksDB backend (rocksdict): one column family per state, key-group-prefixed keys."""

from statehouse.backends.rocksdb.database import TableFiles
from statehouse.backends.rocksdb.partition import RocksDBPartition
from statehouse.backends.rocksdb.store import RocksDBStore

__all__ = ["TableFiles", "RocksDBPartition", "RocksDBStore"]
