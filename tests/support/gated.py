"""A real checkpoint storage whose snapshot-file writes wait for a gate: an upload that takes as
long as the test wants (and, on S3, long enough to pull the server away mid-upload)."""

from __future__ import annotations

import threading
from collections.abc import Callable


def all_but_metadata(path: str) -> bool:
    return "_metadata" not in path


def data_sections(path: str) -> bool:
    return "keyed.bin" in path or "operator.bin" in path


class NextUpload:
    """A ``gates`` predicate that accepts the first write after :meth:`arm` (the metadata aside)
    and sets ``holding``: the one checkpoint uploading then stays in progress, the others go on."""

    def __init__(self) -> None:
        self.holding = threading.Event()
        self._armed = False
        self._lock = threading.Lock()

    def arm(self) -> None:
        with self._lock:
            self._armed = True

    def __call__(self, path: str) -> bool:
        with self._lock:
            taken = self._armed and "_metadata" not in path
            self._armed = self._armed and not taken
        if taken:
            self.holding.set()
        return taken


class Gated:
    """Mixin for a CheckpointStorage: the writes (``create_output``, ``put_file``) whose path
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
        if self._gates(path):
            assert self.gate.wait(30)
        return super().put_file(path, local_path)


def gated(storage_class: type, *args, gates: Callable[[str], bool] = all_but_metadata, **kwargs):
    """A ``storage_class(*args, **kwargs)`` whose writes wait for its ``gate`` (initially closed)."""
    return type(f"Gated{storage_class.__name__}", (Gated, storage_class), {})(*args, gates=gates, **kwargs)
