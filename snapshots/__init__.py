"""The snapshot interfaces, below the backends: checkpoint storage (local directory, S3, memory)
and where restores may read (:mod:`~statehouse.snapshots.storage`), the handles that locate a
snapshot's bytes, its metadata and directory layout, compression codecs, the snapshot-strategy
protocol a backend implements, and the errors of checkpointing and restore.

Nothing here imports a backend. The backends write through these (``statehouse.backends.snapshot``,
``statehouse.backends.rocksdb.snapshot``); the checkpoint runner, catalog, retention, restore and
the manager are above the backends, in ``statehouse.backends.checkpointing``. What reads a checkpoint
without an engine is here too, the full format's reading (:mod:`~statehouse.snapshots.full_format`)
and a job's snapshots and their parts (:mod:`~statehouse.snapshots.catalog`): this folder ships
in the client distribution (its ``checkpoint`` extra brings boto3 and zstandard), so a reader
without a server (the Spark data source) shares it with the server.
"""
