"""A real checkpoint storage whose snapshot-file writes wait for a gate: an upload that takes as
long as the test wants (and, on S3, long enough to pull the server away mid-upload)."""

from __future__ import annotations

import threading
from collections.abc import Callable


def all_but_metadata(path: str) -> bool:
    return "_metadata" not in path


def data_sections(path: str) -> bool:
    return "keyed.bin" in path or "operator.bin" in path


class Gated:
    """Mixin for a CheckpointStorage: ``put_file`` and the ``create_output`` calls whose path
    ``gates`` accepts wait (up to 30 s) for ``self.gate`` to be set."""

    def __init__(self, *args, gates: Callable[[str], bool], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self._gates = gates

    def create_output(self, path):
        if self._gates(path):
            assert self.gate.wait(30)
        return super().create_output(path)

    def put_file(self, path, local_path):
        assert self.gate.wait(30)
        return super().put_file(path, local_path)


def gated(storage_class: type, *args, gates: Callable[[str], bool] = all_but_metadata, **kwargs):
    """A ``storage_class(*args, **kwargs)`` whose writes wait for its ``gate`` (initially closed)."""
    return type(f"Gated{storage_class.__name__}", (Gated, storage_class), {})(*args, gates=gates, **kwargs)
