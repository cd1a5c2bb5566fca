"""Giving memory back to the system when a large holder is dropped.

Staged attempts hold many small objects (fired timers' keys, decoded operations) that glibc's
allocator keeps in its heaps after Python frees them: an aborted epoch's hundreds of MB would
stay in the replica's RSS, reusable by this process only. ``malloc_trim`` returns the free
pages; it costs a walk of the heaps (milliseconds), so it runs only after a large release."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

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
