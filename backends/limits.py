"""Size limits on what a caller may store, enforced by the engine for every entry point."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from statehouse.backends.errors import StateError

logger = logging.getLogger(__name__)


class LimitRefused(StateError):
    """A request refused by a configured limit. Logged at debug, here, once for every limit: a
    refusal is one request's answer (the caller sees it; /metrics counts 4xx), not a server event."""

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail, **extra)
        logger.debug("refused by a limit (%s): %s", self.code, detail)


class KeyTooLarge(LimitRefused):
    code = "key_too_large"


class ValueTooLarge(LimitRefused):
    code = "value_too_large"


class StagingTooLarge(LimitRefused):
    code = "staging_too_large"


class AnswerTooLarge(LimitRefused):
    code = "answer_too_large"


class TooManyJobs(LimitRefused):
    code = "too_many_jobs"


class TooManyStates(LimitRefused):
    code = "too_many_states"


class MapTooLarge(LimitRefused):
    code = "map_too_large"


class ListTooLarge(LimitRefused):
    code = "list_too_large"


class RawStreamTooLarge(LimitRefused):
    code = "raw_stream_too_large"


@dataclass(frozen=True, slots=True)
class Limits:
    """The size and count limits a replica enforces (the ``STATEHOUSE_MAX_*`` settings): what one key,
    value, list, raw stream, whole-map read, answer, job count, state count and epoch's staging may
    hold, with the check that refuses each one in a request's answer."""

    max_key_bytes: int = 4096
    max_value_bytes: int = 1 << 20
    max_staged_bytes: int = 256 << 20  # request bytes staged under one epoch, per job and replica
    max_staged_attempts: int = 10_000  # task attempts staged under one epoch, per job and replica
    # Jobs and keyed states are counted, not sized: on RocksDB each job is a database and each
    # keyed state a column family (a file descriptor, memtables, and an OPTIONS file that RocksDB
    # rewrites whole on every registration), so their number is what a replica pays for.
    max_jobs: int = 1000  # per replica
    max_states_per_job: int = 100  # keyed states; operator states are rows of two shared tables
    # A whole-map read materializes the map in one response; paging (``entries_page``) has no
    # limit. The map itself is not bounded: counting a map's entries on every write would cost
    # a read per write on RocksDB (puts are blind writes there).
    max_map_read_entries: int = 100_000
    # A list is one record that every add appends to (and every read decodes whole), so its
    # stored size is what a write and a read cost; known without decoding, unlike its length.
    max_list_bytes: int = 16 << 20
    # Raw state (``backends/raw_state.py``) is one record per key group (keyed) or per operator
    # subtask (operator partitions) that every append rewrites and every read returns whole.
    max_raw_stream_bytes: int = 16 << 20
    # What one request may read back: the stored bytes of the values its answer carries (a
    # rendered answer is about that size; decoded, a few times more). Counted as rows are read.
    max_answer_bytes: int = 64 << 20

    def check_key(self, encoded: bytes, what: str = "key") -> None:
        if len(encoded) > self.max_key_bytes:
            raise self.key_error(len(encoded), what)

    def key_error(self, size: int, what: str = "key") -> KeyTooLarge:
        return KeyTooLarge(f"{what} is {size} bytes; the limit is {self.max_key_bytes} (STATEHOUSE_MAX_KEY_BYTES)")

    def check_value(self, encoded: bytes) -> None:
        if len(encoded) > self.max_value_bytes:
            raise ValueTooLarge(
                f"value is {len(encoded)} bytes encoded; the limit is {self.max_value_bytes} "
                "(STATEHOUSE_MAX_VALUE_BYTES)"
            )

    def check_map_read(self, entries: int) -> None:
        """A whole-map read that found more than ``max_map_read_entries`` live entries."""
        if entries > self.max_map_read_entries:
            raise MapTooLarge(
                f"the map has more than {self.max_map_read_entries} entries, too many to read whole "
                "(STATEHOUSE_MAX_MAP_READ_ENTRIES); page through it with GET .../keys/{key}/entries"
            )

    def check_list(self, stored_bytes: int) -> None:
        """A list write that would store more than ``max_list_bytes``."""
        if stored_bytes > self.max_list_bytes:
            raise self.list_error(stored_bytes)

    def list_error(self, stored_bytes: int) -> ListTooLarge:
        return ListTooLarge(
            f"the list would be {stored_bytes} bytes stored; the limit is {self.max_list_bytes} "
            "(STATEHOUSE_MAX_LIST_BYTES): clear it, keep fewer elements, or spread it over keys"
        )

    def check_operator_list(self, stored_bytes: int, what: str) -> None:
        """An operator list write that would store more than ``max_list_bytes`` for one subtask:
        like a keyed list, one record that every append rewrites and every read returns whole."""
        if stored_bytes > self.max_list_bytes:
            raise ListTooLarge(
                f"{what} would be {stored_bytes} bytes stored; the limit is {self.max_list_bytes} "
                "(STATEHOUSE_MAX_LIST_BYTES): replace it with fewer elements, or spread them over subtasks or states",
                limit=self.max_list_bytes,
            )

    def check_raw_stream(self, raw_bytes: int, what: str) -> None:
        """A raw-state write after which one record would hold more than ``max_raw_stream_bytes``
        of the client's bytes (a stream's, or a subtask's partitions' together, framing not counted)."""
        if raw_bytes > self.max_raw_stream_bytes:
            raise RawStreamTooLarge(
                f"{what} would be {raw_bytes} bytes; the limit is {self.max_raw_stream_bytes} "
                "(STATEHOUSE_MAX_RAW_STREAM_BYTES): clear it and write less, or keep the data in keyed state",
                limit=self.max_raw_stream_bytes,
            )

    def check_jobs(self, jobs: int) -> None:
        """Before a replica holding ``jobs`` jobs takes one more."""
        if jobs >= self.max_jobs:
            raise TooManyJobs(
                f"this replica holds {jobs} jobs, the limit (STATEHOUSE_MAX_JOBS={self.max_jobs}); "
                "delete a job first, or raise the limit"
            )

    def check_states(self, job: str, states: int) -> None:
        """Before a job holding ``states`` keyed states registers one more (or is restored with them)."""
        if states > self.max_states_per_job:
            raise TooManyStates(
                f"job {job!r} would hold {states} keyed states; the limit is {self.max_states_per_job} "
                "(STATEHOUSE_MAX_STATES_PER_JOB): drop unused states, or spread them over jobs"
            )

    def check_staging(self, attempts: int, staged_bytes: int) -> None:
        if attempts > self.max_staged_attempts:
            raise StagingTooLarge(
                f"{attempts} task attempts staged under one epoch exceed the limit of {self.max_staged_attempts} "
                "(STATEHOUSE_MAX_STAGED_ATTEMPTS); use fewer partitions per micro-batch"
            )
        if staged_bytes > self.max_staged_bytes:
            raise StagingTooLarge(
                f"{staged_bytes} bytes staged under one epoch (writes, fired timers, answers kept for re-sent "
                f"requests) exceed the limit of {self.max_staged_bytes} "
                "(STATEHOUSE_MAX_STAGED_BYTES); make micro-batches smaller (e.g. maxOffsetsPerTrigger) or raise it"
            )


class AnswerMeter:
    """The stored bytes one request's answer carries so far (``Limits.max_answer_bytes``):
    every read that answers charges what it read, before decoding it, so a request that would
    build a too-large answer is refused having read at most the limit and one record more."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def charge(self, size: int) -> None:
        self.used += size
        if self.used > self.limit:
            raise AnswerTooLarge(
                f"the answer would exceed {self.limit} bytes (STATEHOUSE_MAX_ANSWER_BYTES); read fewer keys per "
                "request, or page the map (GET .../keys/{key}/entries)",
                limit=self.limit,
            )

    def read_many(self, read: Callable[[int], list[bytes | None]]) -> list[bytes | None]:
        """``read(budget)`` (a ``get_many`` given the bytes left), charged: a backend whose reads
        copy stops past the budget, so a refused read holds at most the limit and one record."""
        found = read(self.limit - self.used)
        self.charge(sum(map(len, filter(None, found))))
        return found

    def items(self, stored: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        """Stored entries (user key, record) as they are read, each charged."""
        for secondary, raw in stored:
            self.charge(len(secondary) + len(raw))
            yield secondary, raw
