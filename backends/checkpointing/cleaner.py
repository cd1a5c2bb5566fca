"""Deleting what retention let go, off the answer path (Flink's ``CheckpointsCleaner``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)


class CheckpointCleaner:
    """Runs retention's storage deletes one after another on a thread of its own, so that a
    checkpoint's completion answers once its metadata is written: on S3 the deletes of the part
    it subsumes are two more requests (6-15 ms of every micro-batch's completion, measured in
    bench/replica.py). What goes is decided before, under retention's lock; only the deleting
    waits here. :meth:`drain` waits for everything handed over so far; :meth:`close` drains and
    stops the thread (what is handed over after runs at once, in the caller's thread)."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="checkpoint-cleaner"
        )

    def submit(self, clean: Callable[[], None]) -> None:
        executor = self._executor
        try:
            if executor is not None:
                executor.submit(self._run, clean)
                return
        except RuntimeError:  # closed meanwhile: shut down, it takes no more
            pass
        self._run(clean)

    @staticmethod
    def _run(clean: Callable[[], None]) -> None:
        try:
            clean()
        except Exception:  # the deletes log their own failures; this is anything else
            log.exception("deleting subsumed checkpoint files failed")

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until what was handed over so far is done (one worker: in order); whether it is."""
        executor = self._executor
        if executor is None:
            return True
        try:
            executor.submit(lambda: None).result(timeout)
        except TimeoutError:
            return False
        except RuntimeError:  # closed meanwhile: its shutdown runs what it was handed, then ends
            executor.shutdown(wait=True)
        return True

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
