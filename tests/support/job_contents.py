"""A job filled with every kind of state, its contents dumped as stored bytes, and a global
checkpoint taken by hand: what the snapshot, restore and rescale tests compare."""

from __future__ import annotations

from statehouse.backends.job import Job
from statehouse.backends.reserved import NON_KEYED_TABLES
from statehouse.protocol.keygroups import assign_to_key_group, operator_index
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.ttl import TtlConfig

STATES = [
    StateDescriptor("v", "value"),
    StateDescriptor("l", "list", key_type="int"),
    StateDescriptor("m", "map"),
    StateDescriptor("r", "reducing", key_type="long", function="sum"),
    StateDescriptor("t", "value", ttl=TtlConfig(1_000)),
]


def owned_keys(job: Job, keys, key_type: str = "string"):
    return [k for k in keys if assign_to_key_group(k, key_type, job.max_parallelism) in job.key_group_range]


def owner(key, key_type: str, max_parallelism: int, replica_count: int) -> int:
    return operator_index(max_parallelism, replica_count, assign_to_key_group(key, key_type, max_parallelism))


def populate(job: Job, n: int = 200, tag: str = "") -> None:
    """Write ``n`` keys of each state (only the keys this replica owns) and some operator state."""
    for descriptor in STATES:
        job.register_state(descriptor)
    with job.transaction() as tx:
        for k in owned_keys(job, [f"k{i}" for i in range(n)]):
            tx.value("v").update(k, {"n": k, "tag": tag})
            tx.map("m").put_all(k, {"a": 1, "b": [k, tag]})
            tx.value("t").update(k, k)
            tx.value("v").update(k, f"ns-{k}", namespace="w1")
        for i in owned_keys(job, range(n), "int"):
            tx.list("l").add_all(i, [i, i + 1, tag])
        for i in owned_keys(job, [i * 7_919_000_001 for i in range(n)], "long"):
            tx.reducing("r").add(i, i)
        tx.operator.list_update("src", job.replica_index, "offsets", [job.replica_index, tag])
        tx.operator.list_update("src", job.replica_index, "all", [f"u{job.replica_index}"], mode="union")
        tx.operator.broadcast_put("rules", "cfg", "limit", 10)


def dump(job: Job) -> dict:
    """Every keyed entry of the job as stored bytes: ``(table, kg, primary, secondary) -> value``."""
    out = {}
    for table in job.partition.tables():
        if table in NON_KEYED_TABLES:
            continue
        for kg in job.key_group_range:
            for primary, secondary, value in job.partition.scan(table, kg):
                out[(table, kg, primary, secondary)] = value
    return out


def operator_dump(job: Job) -> dict:
    out = {}
    for table in ("$operator-lists", "$broadcast"):
        for primary, secondary, value in job.partition.scan(table, 0):
            out[(table, primary, secondary)] = value
    return out


def global_checkpoint(managers, job: str, checkpoint_id: int, kind: str = "checkpoint") -> None:
    """What the coordinator does for one global checkpoint: trigger it on every replica, wait until
    every part is uploaded, then complete it everywhere."""
    for m in managers:
        m.trigger(job, checkpoint_id, kind=kind)
    for m in managers:
        assert m.wait(job, checkpoint_id, 30).status == "uploaded"
    for m in managers:
        m.complete(job, checkpoint_id)
