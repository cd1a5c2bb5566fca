"""Key groups, bit-for-bit compatible with Flink's ``KeyGroupRangeAssignment``.

A key's key group is ``murmurHash(hashCode(key)) % max_parallelism``; a replica (Flink:
operator subtask) owns a contiguous range of key groups. The client computes the same
functions to route a key to its replica, so this module has no dependencies.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

UPPER_BOUND_MAX_PARALLELISM = 1 << 15  # Flink's Transformation.UPPER_BOUND_MAX_PARALLELISM
DEFAULT_LOWER_BOUND_MAX_PARALLELISM = 1 << 7

KeyType = Literal["string", "int", "long"]
KEY_TYPES: tuple[KeyType, ...] = ("string", "int", "long")

_M32 = 0xFFFFFFFF
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _to_int32(x: int) -> int:
    x &= _M32
    return x - (1 << 32) if x & 0x80000000 else x


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def murmur_hash(code: int) -> int:
    """Flink's ``MathUtils.murmurHash(int)``: MurmurHash3 x86_32 of one int, made non-negative."""
    c = ((code & _M32) * 0xCC9E2D51) & _M32
    c = _rotl32(c, 15)
    c = (c * 0x1B873593) & _M32
    c = _rotl32(c, 13)
    c = (c * 5 + 0xE6546B64) & _M32
    c ^= 4
    c ^= c >> 16
    c = (c * 0x85EBCA6B) & _M32
    c ^= c >> 13
    c = (c * 0xC2B2AE35) & _M32
    c ^= c >> 16
    s = _to_int32(c)
    if s >= 0:
        return s
    return -s if s != INT32_MIN else 0


def java_string_hash(s: str) -> int:
    """``String.hashCode``: ``h = 31*h + u`` over UTF-16 code units, int32 wrap-around."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & _M32
    return _to_int32(h)


def java_int_hash(v: int) -> int:
    """``Integer.hashCode``: the value itself (must fit int32)."""
    if not INT32_MIN <= v <= INT32_MAX:
        raise ValueError(f"{v} does not fit a 32-bit int key")
    return v


def java_long_hash(v: int) -> int:
    """``Long.hashCode``: ``(int)(v ^ (v >>> 32))``."""
    if not INT64_MIN <= v <= INT64_MAX:
        raise ValueError(f"{v} does not fit a 64-bit long key")
    v &= (1 << 64) - 1
    return _to_int32(v ^ (v >> 32))


def java_hash_code(key: str | int, key_type: KeyType) -> int:
    if key_type == "string":
        return java_string_hash(key)  # type: ignore[arg-type]
    if key_type == "int":
        return java_int_hash(key)  # type: ignore[arg-type]
    return java_long_hash(key)  # type: ignore[arg-type]


def check_max_parallelism(max_parallelism: int) -> None:
    if not 0 < max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise ValueError(f"max_parallelism must be in [1, {UPPER_BOUND_MAX_PARALLELISM}], got {max_parallelism}")


def assign_to_key_group(key: str | int, key_type: KeyType, max_parallelism: int) -> int:
    """Flink's ``assignToKeyGroup(key, maxParallelism)``."""
    return murmur_hash(java_hash_code(key, key_type)) % max_parallelism


def compute_key_group_for_hash(key_hash: int, max_parallelism: int) -> int:
    return murmur_hash(key_hash) % max_parallelism


def operator_index(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """``computeOperatorIndexForKeyGroup``: which of ``parallelism`` subtasks owns ``key_group``."""
    return key_group * parallelism // max_parallelism


def _round_up_to_power_of_two(x: int) -> int:
    x -= 1
    for shift in (1, 2, 4, 8, 16):
        x |= x >> shift
    return x + 1


def default_max_parallelism(parallelism: int) -> int:
    """``computeDefaultMaxParallelism``: 1.5 x parallelism rounded up to a power of two, in [128, 32768]."""
    return min(
        max(_round_up_to_power_of_two(parallelism + parallelism // 2), DEFAULT_LOWER_BOUND_MAX_PARALLELISM),
        UPPER_BOUND_MAX_PARALLELISM,
    )


@dataclass(frozen=True, slots=True)
class KeyGroupRange:
    """An inclusive range ``[start, end]`` of key groups; ``end < start`` is the empty range."""

    start: int
    end: int

    @classmethod
    def empty(cls) -> KeyGroupRange:
        return cls(0, -1)

    @classmethod
    def for_operator(cls, max_parallelism: int, parallelism: int, index: int) -> KeyGroupRange:
        """Flink's ``computeKeyGroupRangeForOperatorIndex``."""
        check_max_parallelism(max_parallelism)
        if not 0 < parallelism <= max_parallelism:
            raise ValueError(f"parallelism must be in [1, max_parallelism={max_parallelism}], got {parallelism}")
        if not 0 <= index < parallelism:
            raise ValueError(f"index must be in [0, {parallelism}), got {index}")
        start = (index * max_parallelism + parallelism - 1) // parallelism
        end = ((index + 1) * max_parallelism - 1) // parallelism
        return cls(start, end)

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        start, end = max(self.start, other.start), min(self.end, other.end)
        return KeyGroupRange(start, end) if start <= end else KeyGroupRange.empty()

    def as_list(self) -> list[int]:
        return [self.start, self.end]


def range_for_operator(max_parallelism: int, parallelism: int, index: int) -> KeyGroupRange:
    return KeyGroupRange.for_operator(max_parallelism, parallelism, index)
