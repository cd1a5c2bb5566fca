"""Giving memory back to the system when a large holder is dropped, and whether there is room to
copy the process (a forked writer).

Staged attempts hold many small objects (fired timers' keys, decoded operations) that glibc's
allocator keeps in its heaps after Python frees them: an aborted epoch's hundreds of MB would
stay in the replica's RSS, reusable by this process only. ``malloc_trim`` returns the free
pages; it costs a walk of the heaps (milliseconds), so it runs only after a large release."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from pathlib import Path

TRIM_AFTER_BYTES = 16 << 20  # releases smaller than this are left to the allocator


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_TRIM = _malloc_trim()


def released(size: int) -> None:
    """``size`` bytes (as accounted) were just freed: give the allocator's free pages back."""
    if size >= TRIM_AFTER_BYTES and _TRIM is not None:
        _TRIM(0)


# The share of the container's limit (or of what the system has available) a forked copy may
# bring the replica to: the rest is headroom for the writes that go on meanwhile.
COPY_HEADROOM = 0.8


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _container_memory() -> tuple[int, int] | None:
    """The container's memory limit and use (cgroup v2, else v1), None without a limit."""
    for limit_file, use_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit, used = _read_int(limit_file), _read_int(use_file)
        if limit is not None and used is not None and limit < 1 << 60:  # v1 writes a huge number for none
            return limit, used
    return None


def _available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def resident_bytes() -> int | None:
    """This process's resident memory."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def room_for_a_copy() -> bool:
    """Whether this process's memory could be copied once more (by a forked child) within the
    container's limit, or without one within what the system has available."""
    rss = resident_bytes()
    if rss is None:
        return False
    container = _container_memory()
    if container is not None:
        limit, used = container
        return used + rss <= COPY_HEADROOM * limit
    available = _available()
    return available is not None and rss <= COPY_HEADROOM * available
