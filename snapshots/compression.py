"""Per-key-group compression of full snapshots (Flink: ``snapshot-compression``, Snappy there).

Each key-group section is compressed on its own, so a restore of a sub-range decompresses
only what it reads. The section records which codec wrote it, so readers need no setting.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

import zstandard

CompressionName = Literal["none", "zstd"]
COMPRESSIONS: tuple[CompressionName, ...] = ("none", "zstd")
# Level 1: on key-group sections of msgpack records, 2.2x faster than zstd's default (3) and no
# worse a ratio (bench/RESULTS.md §28); far better than Snappy's.
_ZSTD_LEVEL = 1


@dataclass(frozen=True, slots=True)
class Codec:
    name: CompressionName
    id: int

    def compress(self, data: bytes) -> bytes:
        if self.name == "none" or not data:
            return data
        return _ZSTD.compressor.compress(data)

    def decompress(self, data: bytes) -> bytes:
        if self.name == "none" or not data:
            return data
        return _ZSTD.decompressor.decompress(data)


class _Zstd(threading.local):
    """This thread's zstd compressor and decompressor: they are not thread-safe, and making one
    costs several times a key group section's compression (~18 µs against ~3)."""

    def __init__(self) -> None:
        self.compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)
        self.decompressor = zstandard.ZstdDecompressor()


_ZSTD = _Zstd()


NONE = Codec("none", 0)
ZSTD = Codec("zstd", 1)
_BY_NAME = {c.name: c for c in (NONE, ZSTD)}
_BY_ID = {c.id: c for c in (NONE, ZSTD)}


def codec(name: str) -> Codec:
    try:
        return _BY_NAME[name]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}; got {name!r}") from None


def codec_by_id(codec_id: int) -> Codec:
    return _BY_ID[codec_id]
