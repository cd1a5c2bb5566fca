"""State time-to-live, as Flink's ``StateTtlConfig`` and ``TtlUtils`` define it: the config a
descriptor carries and when a stored entry's timestamp makes it expired. Shared with the client
distribution, so a checkpoint reader without a server applies the same visibility rule (the
clocks that decide "now" on the server are ``statehouse.backends.ttl``'s)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from statehouse.protocol.keygroups import INT64_MAX

UpdateType = Literal["on_create_and_write", "on_read_and_write"]
Visibility = Literal["never_return_expired", "return_expired_if_not_cleaned_up"]
UPDATE_TYPES: tuple[UpdateType, ...] = ("on_create_and_write", "on_read_and_write")
VISIBILITIES: tuple[Visibility, ...] = ("never_return_expired", "return_expired_if_not_cleaned_up")

MAX_LONG = INT64_MAX  # Java's Long.MAX_VALUE


@dataclass(frozen=True, slots=True)
class TtlConfig:
    """Flink's ``StateTtlConfig``.

    ``cleanup_full_snapshot`` drops expired entries when a full snapshot is written;
    ``cleanup_incremental_size`` entries are checked on every state access (Flink's
    ``cleanupIncrementally(5, false)`` background default; 0 turns it off).
    """

    ttl_ms: int
    update_type: UpdateType = "on_create_and_write"
    visibility: Visibility = "never_return_expired"
    cleanup_full_snapshot: bool = True
    cleanup_incremental_size: int = 5

    def __post_init__(self) -> None:
        if not isinstance(self.ttl_ms, int) or isinstance(self.ttl_ms, bool) or self.ttl_ms <= 0:
            raise ValueError(f"ttl_ms must be a positive integer, got {self.ttl_ms!r}")
        if self.update_type not in UPDATE_TYPES:
            raise ValueError(f"update_type must be one of {UPDATE_TYPES}, got {self.update_type!r}")
        if self.visibility not in VISIBILITIES:
            raise ValueError(f"visibility must be one of {VISIBILITIES}, got {self.visibility!r}")
        if self.cleanup_incremental_size < 0:
            raise ValueError("cleanup_incremental_size must be >= 0")

    @property
    def refresh_on_read(self) -> bool:
        return self.update_type == "on_read_and_write"

    @property
    def return_expired(self) -> bool:
        return self.visibility == "return_expired_if_not_cleaned_up"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def expiration_timestamp(timestamp: int, ttl_ms: int) -> int:
    """``TtlUtils.getExpirationTimestamp``: when an entry written at ``timestamp`` expires,
    ``timestamp + ttl`` kept at most ``Long.MAX_VALUE`` (Java's guard against the sum overflowing)."""
    return min(timestamp + ttl_ms, MAX_LONG)


def is_expired(timestamp: int, ttl_ms: int, now: int) -> bool:
    """``TtlUtils.expired``: the expiration timestamp is reached (the boundary expires)."""
    return expiration_timestamp(timestamp, ttl_ms) <= now
