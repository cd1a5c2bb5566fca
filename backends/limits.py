"""Size limits on what a caller may store, enforced by the engine for every entry point."""

from __future__ import annotations

from dataclasses import dataclass

from statehouse.backends.errors import StateError


class KeyTooLarge(StateError):
    code = "key_too_large"


class ValueTooLarge(StateError):
    code = "value_too_large"


@dataclass(frozen=True, slots=True)
class Limits:
    max_key_bytes: int = 4096
    max_value_bytes: int = 1 << 20

    def check_key(self, encoded: bytes, what: str = "key") -> None:
        if len(encoded) > self.max_key_bytes:
            raise KeyTooLarge(f"{what} is {len(encoded)} bytes; the limit is {self.max_key_bytes}")

    def check_value(self, encoded: bytes) -> None:
        if len(encoded) > self.max_value_bytes:
            raise ValueTooLarge(
                f"value is {len(encoded)} bytes encoded; the limit is {self.max_value_bytes} "
                "(STATEHOUSE_MAX_VALUE_BYTES)"
            )
