"""Checkpoints and savepoints of Statehouse jobs, above the backends, no HTTP inside.

:class:`~statehouse.checkpointing.manager.CheckpointManager` is the entry point the service
calls: it runs a backend's snapshot strategy (:mod:`~statehouse.checkpointing.runner`), tracks
pending and completed checkpoints, keeps the retained ones and their shared files
(:mod:`~statehouse.checkpointing.retention`, :mod:`~statehouse.checkpointing.registry`), lists what
storage holds (:mod:`~statehouse.checkpointing.catalog`) and restores with rescaling
(:mod:`~statehouse.checkpointing.restore`). The interfaces it works through (storage, handles,
metadata, the strategy protocol) are below the backends, in ``statehouse.snapshots``.
"""
