"""RocksDB backend (rocksdict): one column family per state, key-group-prefixed keys."""

from backends.rocksdb.partition import RocksDBPartition
from backends.rocksdb.store import RocksDBStore

__all__ = ["RocksDBPartition", "RocksDBStore"]
