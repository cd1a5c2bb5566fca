"""Key groups, bit-for-bit compatible with Flink's ``KeyGroupRangeAssignment``.

A key's key group is ``murmurHash(hashCode(key)) % max_parallelism``; a replica (Flink:
operator subtask) owns a contiguous range of key groups. The client computes the same
functions to route a key to its replica, so this module has no dependencies.
"""

from __future__ import annotations

import operator
import struct
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


def murmur_hash(code: int) -> int:
    """Flink's ``MathUtils.murmurHash(int)``: MurmurHash3 x86_32 of one int, made non-negative."""
    # The rotations and the int32 conversions are inlined: this runs for every keyed operation.
    c = ((code & _M32) * 0xCC9E2D51) & _M32
    c = ((c << 15) | (c >> 17)) & _M32
    c = (c * 0x1B873593) & _M32
    c = ((c << 13) | (c >> 19)) & _M32
    c = (c * 5 + 0xE6546B64) & _M32
    c ^= 4
    c ^= c >> 16
    c = (c * 0x85EBCA6B) & _M32
    c ^= c >> 13
    c = (c * 0xC2B2AE35) & _M32
    c ^= c >> 16
    if not c & 0x80000000:
        return c
    return (1 << 32) - c if c != 0x80000000 else 0  # -int32(c), and Integer.MIN_VALUE -> 0


_POWERS_OF_31 = [1]  # 31**i mod 2**32; replaced (never mutated) when a longer key needs more


def _powers_of_31(n: int) -> list[int]:
    """``[31**(n-1), ..., 31**0]`` mod 2**32."""
    global _POWERS_OF_31
    powers = _POWERS_OF_31
    if len(powers) < n:
        powers = list(powers)
        while len(powers) < n:
            powers.append((powers[-1] * 31) & _M32)
        _POWERS_OF_31 = powers  # one atomic rebind, so concurrent callers never see a half-built list
    return powers[n - 1 :: -1]


def java_string_hash(s: str) -> int:
    """``String.hashCode``: ``h = 31*h + u`` over UTF-16 code units, int32 wrap-around.

    Evaluated as ``sum(u[i] * 31**(n-1-i))`` mod 2**32, so the loop runs in C.
    """
    if s.isascii():
        units: bytes | tuple[int, ...] = s.encode("ascii")  # ASCII bytes are their UTF-16 code units
    else:
        data = s.encode("utf-16-be", "surrogatepass")
        units = struct.unpack(f">{len(data) // 2}H", data)
    if not units:
        return 0
    return _to_int32(sum(map(operator.mul, units, _powers_of_31(len(units)))))


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


MEMO_KEY_CHARS = 256  # the longest string key a KeyGroupAssigner remembers


class KeyGroupAssigner:
    """:func:`assign_to_key_group` for one max parallelism, memoized.

    Keys repeat in streams (the same users, again and again), and hashing a string key in
    Python costs about a microsecond. The memo is bounded: when full it starts over; and it keeps
    no string key longer than ``MEMO_KEY_CHARS`` (full of keys at the 4 KB key limit, it would
    hold ~0.5 GB; at this bound at most ~60 MB), whose hashing costs more than the lookup saves
    anyway.
    """

    def __init__(self, max_parallelism: int, capacity: int = 1 << 17) -> None:
        check_max_parallelism(max_parallelism)
        self.max_parallelism = max_parallelism
        self.capacity = capacity
        self._memo: dict[KeyType, dict[str | int, int]] = {t: {} for t in KEY_TYPES}

    def __call__(self, key: str | int, key_type: KeyType) -> int:
        memo = self._memo[key_type]
        key_group = memo.get(key)
        if key_group is None:
            key_group = assign_to_key_group(key, key_type, self.max_parallelism)
            if key_type != "string" or len(key) <= MEMO_KEY_CHARS:  # type: ignore[arg-type]
                if len(memo) >= self.capacity:
                    memo.clear()
                memo[key] = key_group
        return key_group


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
