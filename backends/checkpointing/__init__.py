"""Checkpoints and savepoints of Statehouse jobs, above the backends, no HTTP inside.

:class:`~statehouse.backends.checkpointing.manager.CheckpointManager` is the entry point the service
calls: it runs a backend's snapshot strategy (:mod:`~statehouse.backends.checkpointing.runner`), tracks
pending and completed checkpoints, keeps the retained ones and their shared files
(:mod:`~statehouse.backends.checkpointing.retention`, :mod:`~statehouse.backends.checkpointing.registry`), lists what
storage holds (:mod:`~statehouse.backends.checkpointing.catalog`) and restores with rescaling
(:mod:`~statehouse.backends.checkpointing.restore`). The interfaces it works through (storage, handles,
metadata, the strategy protocol) are below the backends, in ``statehouse.snapshots``.
"""
