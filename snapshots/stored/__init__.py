"""How keyed state is stored, below the backends and in both distributions: the value and key
codecs (:mod:`~statehouse.snapshots.stored.codec`), state descriptors, their value types and functions,
the TTL config and expiry rule, the RocksDB key layout (:mod:`~statehouse.snapshots.stored.keys`) and the
Arrow form of stored values (:mod:`~statehouse.snapshots.stored.arrow`, which needs pyarrow).

The engine (``statehouse.backends``) writes and reads state through these; a reader of a
checkpoint without a server (the Spark data source's ``option("checkpoint", ...)``) decodes the
same stored bytes with the same code, so a state reads alike from live replicas and from a
checkpoint. Nothing here imports a backend.
"""
