"""How any backend's state is snapshotted: the canonical full format of keyed state, the
operator-state format, and the full strategy that writes them from a frozen view (heap
checkpoints, RocksDB full checkpoints, every savepoint). They read the engine's own types
(frozen views, descriptors, TTL cleaners), so they sit in the engine; the interfaces they
write through (storage, handles, the strategy protocol) are below it in ``statehouse.snapshots``.
"""
