"""The clocks TTL reads (only processing time exists, as in Flink). The clock is injectable so
tests need no sleeps. The TTL config and expiry rule are ``statehouse.snapshots.stored.ttl``."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    """Wall-clock milliseconds, Flink's ``System.currentTimeMillis()``."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, now_ms: int = 0) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms
