"""How any backend's state is snapshotted and read back: the canonical full format of keyed
state, the operator-state format, the full strategy that writes them from a frozen view (heap
checkpoints, RocksDB full checkpoints, every savepoint), and the part readers a restore asks by
format (``restore.part_reader``). They read the engine's own types (frozen views, descriptors,
TTL cleaners) through the interfaces of ``statehouse.backends.base``, never the job above them;
what they write through (storage, handles, the strategy protocol) is below, in
``statehouse.snapshots``.
"""
