"""The interface every backend implements (Quix Streams' ``state/base`` layout)."""

from statehouse.backends.base.partition import FrozenView, StorePartition, WriteOp
from statehouse.backends.base.store import Store
from statehouse.backends.base.transaction import PartitionTransaction

__all__ = ["FrozenView", "PartitionTransaction", "Store", "StorePartition", "WriteOp"]
