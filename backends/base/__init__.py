"""The interface every backend implements (Quix Streams' ``state/base`` layout)."""

from backends.base.partition import FrozenView, StorePartition, WriteOp
from backends.base.store import Store
from backends.base.transaction import PartitionTransaction

__all__ = ["FrozenView", "PartitionTransaction", "Store", "StorePartition", "WriteOp"]
