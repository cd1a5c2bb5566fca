"""Heap copy-on-write: a freeze copies nothing up front; a write copies only what it touches."""

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.heap import HeapStore
from statehouse.snapshots.stored.descriptors import StateDescriptor


def make_job():
    job, _ = JobCatalog(HeapStore()).create("j", 128)
    job.register_state(StateDescriptor("v", "value"))
    job.register_state(StateDescriptor("m", "map"))
    with job.transaction() as tx:
        for i in range(1000):
            tx.value("v").update(f"k{i}", i)
            tx.map("m").put(f"k{i}", "a", i)
    return job


def group_dicts(job, table):
    return {kg: c.data for kg, c in job.partition._tables[table].groups.items()}


def test_freeze_shares_every_key_group():
    job = make_job()
    before = group_dicts(job, "v")
    view = job.partition.freeze()
    after = group_dicts(job, "v")
    assert all(after[kg] is before[kg] for kg in before)  # nothing was copied
    view.release()


def test_write_after_freeze_copies_only_the_touched_key_group():
    job = make_job()
    view = job.partition.freeze()
    before = group_dicts(job, "v")
    touched = job.keyspace.key_group("k1", job.descriptor("v").key_type)
    with job.transaction() as tx:
        tx.value("v").update("k1", -1)
    after = group_dicts(job, "v")
    assert after[touched] is not before[touched]
    assert all(after[kg] is before[kg] for kg in before if kg != touched)
    assert dict(((p, v) for p, _s, v in view.scan("v", touched))) != dict(after[touched])
    view.release()


def test_nested_map_entries_are_copied_before_mutation():
    job = make_job()
    view = job.partition.freeze()
    kg = job.keyspace.key_group("k7", job.descriptor("m").key_type)
    frozen = list(view.scan("m", kg))
    with job.transaction() as tx:
        tx.map("m").put("k7", "b", 1)
        tx.map("m").remove("k7", "a")
    assert list(view.scan("m", kg)) == frozen
    view.release()


def test_no_copies_after_release():
    job = make_job()
    job.partition.freeze().release()
    before = group_dicts(job, "v")
    with job.transaction() as tx:
        tx.value("v").update("k1", -1)
    after = group_dicts(job, "v")
    assert all(after[kg] is before[kg] for kg in before)
