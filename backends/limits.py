"""Size limits on what a caller may store, enforced by the engine for every entry point."""

from __future__ import annotations

from dataclasses import dataclass

from statehouse.backends.errors import StateError


class KeyTooLarge(StateError):
    code = "key_too_large"


class ValueTooLarge(StateError):
    code = "value_too_large"


class StagingTooLarge(StateError):
    code = "staging_too_large"


@dataclass(frozen=True, slots=True)
class Limits:
    max_key_bytes: int = 4096
    max_value_bytes: int = 1 << 20
    max_staged_bytes: int = 256 << 20  # request bytes staged under one epoch, per job and replica
    max_staged_attempts: int = 10_000  # task attempts staged under one epoch, per job and replica

    def check_key(self, encoded: bytes, what: str = "key") -> None:
        if len(encoded) > self.max_key_bytes:
            raise self.key_error(len(encoded), what)

    def key_error(self, size: int, what: str = "key") -> KeyTooLarge:
        return KeyTooLarge(f"{what} is {size} bytes; the limit is {self.max_key_bytes}")

    def check_value(self, encoded: bytes) -> None:
        if len(encoded) > self.max_value_bytes:
            raise ValueTooLarge(
                f"value is {len(encoded)} bytes encoded; the limit is {self.max_value_bytes} "
                "(STATEHOUSE_MAX_VALUE_BYTES)"
            )

    def check_staging(self, attempts: int, staged_bytes: int) -> None:
        if attempts > self.max_staged_attempts:
            raise StagingTooLarge(
                f"{attempts} task attempts staged under one epoch exceed the limit of {self.max_staged_attempts} "
                "(STATEHOUSE_MAX_STAGED_ATTEMPTS); use fewer partitions per micro-batch"
            )
        if staged_bytes > self.max_staged_bytes:
            raise StagingTooLarge(
                f"{staged_bytes} bytes of writes staged under one epoch exceed the limit of {self.max_staged_bytes} "
                "(STATEHOUSE_MAX_STAGED_BYTES); make micro-batches smaller (e.g. maxOffsetsPerTrigger) or raise it"
            )
