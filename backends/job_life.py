"""A job's life: the lock every change to it holds, and its retirement by a restore's swap."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from statehouse.backends.errors import JobReplaced


class JobLife:
    """The reentrant lock every write to a job (and the synchronous part of its snapshot) holds,
    and whether a restore retired the job.

    A restore swaps in a new ``Job`` and retires the old one under this lock, so a write lands
    either before the swap (and is replaced with the rest) or is refused after it (``not_ready``:
    retry), never lost. The job's collaborators that must not interleave with a write (staging,
    fencing) share this one lock."""

    def __init__(self, job: str) -> None:
        self.job = job  # the job's name, for errors
        self.lock = threading.RLock()
        self.retired = False

    def check_live(self) -> None:
        """Refuse an access to a retired job."""
        if self.retired:
            raise JobReplaced(f"job {self.job!r} was restored while this request waited; retry it")

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lock, refusing if the job was retired."""
        with self.lock:
            self.check_live()
            yield

    @contextmanager
    def held_if_free(self, usable: Callable[[], bool]) -> Iterator[bool]:
        """Take the lock only if nobody holds it, and say whether it was taken and ``usable()``
        (the storage is open) holds. The lock is reentrant: work run inside takes it again."""
        taken = self.lock.acquire(blocking=False)
        try:
            yield taken and usable()
        finally:
            if taken:
                self.lock.release()
