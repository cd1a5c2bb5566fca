"""The keyed states a job serves: their descriptors, in memory and in the job's metadata."""

from __future__ import annotations

import json
from typing import Literal

from statehouse.backends.base.partition import StorePartition
from statehouse.backends.base.transaction import PartitionTransaction
from statehouse.backends.errors import StateNotFound
from statehouse.backends.keyspace import KeySpace
from statehouse.backends.limits import Limits
from statehouse.backends.reserved import META_TABLE, STATE_META
from statehouse.snapshots.stored.descriptors import StateDescriptor

# What a registration did: a new state, a compatible change stored over the old descriptor, or nothing.
Registered = Literal["new", "replaced", "unchanged"]


def stored_descriptors(partition: StorePartition) -> dict[str, StateDescriptor]:
    """The state descriptors a partition holds (what a job opened on it serves)."""
    found = {}
    for key, value in partition.meta_items():
        if key.startswith(STATE_META):
            descriptor = StateDescriptor.from_dict(json.loads(value))
            found[descriptor.name] = descriptor
    return found


class StateRegistry:
    """A job's state descriptors by name, and each state's table.

    The descriptors are read from the partition's metadata once, when the job opens, and kept
    in memory from then on (every operation looks its state up); a registration writes the
    metadata row (and makes the table) and then changes the dict, so the two agree. The caller
    holds the job's lock."""

    def __init__(self, job: str, partition: StorePartition, limits: Limits) -> None:
        self.job = job  # the job's name, for errors
        self.partition = partition
        self.limits = limits
        self.descriptors: dict[str, StateDescriptor] = stored_descriptors(partition)

    def get(self, name: str) -> StateDescriptor:
        """The descriptor of state ``name``; ``state_not_found`` saying how to register it."""
        try:
            return self.descriptors[name]
        except KeyError:
            raise StateNotFound(
                f"job {self.job!r} has no state {name!r}; register it first "
                f'(PUT /v1/jobs/{self.job}/states/{name} with {{"kind": ...}})'
            ) from None

    def register(self, descriptor: StateDescriptor, keyspace: KeySpace, *, loading: bool) -> Registered:
        """Register ``descriptor``, or store a compatible change of an existing one (e.g. a new TTL
        duration); not while a live rescale froze the job (the moved key groups would keep the old
        one), except by the move's own load (``loading``), which registers the snapshot's states."""
        existing = self.descriptors.get(descriptor.name)
        if existing is not None:
            descriptor.check_compatible(existing)
            if existing == descriptor:
                return "unchanged"
            if not loading:
                keyspace.check_not_frozen(f"changing state {descriptor.name!r}")
        else:
            self.limits.check_states(self.job, len(self.descriptors) + 1)
        self.partition.create_table(descriptor.name, nested=descriptor.kind == "map")
        tx = PartitionTransaction(self.partition)
        tx.put(META_TABLE, 0, STATE_META + descriptor.name.encode(), json.dumps(descriptor.to_dict()).encode())
        tx.commit()
        self.descriptors[descriptor.name] = descriptor
        return "new" if existing is None else "replaced"

    def unregister(self, name: str, keyspace: KeySpace) -> None:
        """Forget state ``name`` (its table stays: the caller drops it once nothing walks it); not
        while a live rescale froze the job (the checkpoint the move loads from still holds the
        state: dropped here, it would come back)."""
        self.get(name)
        keyspace.check_not_frozen(f"dropping state {name!r}")
        tx = PartitionTransaction(self.partition)
        tx.delete(META_TABLE, 0, STATE_META + name.encode())
        tx.commit()
        del self.descriptors[name]
