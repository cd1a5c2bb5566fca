"""Cursor paging for listings: ``?limit=&cursor=`` → ``{"items": [...], "next_cursor": ...}``."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from itertools import islice
from typing import TypeVar

from statehouse.app.problems import ApiError

T = TypeVar("T")


def encode_cursor(position: bytes) -> str:
    return base64.urlsafe_b64encode(position).decode("ascii")


def decode_cursor(cursor: str | None) -> bytes | None:
    if cursor is None:
        return None
    try:
        decoded = base64.b64decode(cursor.encode("ascii"), altchars=b"-_", validate=True)
        if decoded:
            return decoded
    except (binascii.Error, ValueError, UnicodeEncodeError):
        pass
    raise ApiError("invalid_argument", "cursor is not valid: pass back a next_cursor unchanged")


def take_page(items: Iterable[T], limit: int, position: Callable[[T], bytes]) -> tuple[list[T], str | None]:
    """Up to ``limit`` items, and the cursor after the last one when more follow."""
    page = list(islice(items, limit + 1))
    if len(page) <= limit:
        return page, None
    page = page[:limit]
    return page, encode_cursor(position(page[-1]))
