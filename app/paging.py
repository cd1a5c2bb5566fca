"""Cursor paging for listings: ``?limit=&cursor=`` → ``{"items": [...], "next_cursor": ...}``.

Every listing takes its parameters through :data:`PageDep`, so every page is capped at
``STATEHOUSE_MAX_PAGE_SIZE`` and every cursor is checked the same way.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Annotated, TypeVar

from fastapi import Depends, Query

from statehouse.app.dependencies import ServiceDep
from statehouse.app.problems import ApiError

T = TypeVar("T")

_INVALID = "cursor is not valid: pass back a next_cursor unchanged"


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
    raise ApiError("invalid_argument", _INVALID)


@dataclass(frozen=True)
class PageRequest:
    """A listing's page as the request asks for it (``?limit=`` and ``?cursor=``), with what every
    paged route needs: the cursor as an integer, the page taken from the items, the next cursor."""

    limit: int  # already capped at STATEHOUSE_MAX_PAGE_SIZE
    after: bytes | None  # the decoded cursor: the position of the last item of the previous page

    def after_int(self) -> int | None:
        """The cursor of a listing that pages by a non-negative integer (e.g. checkpoint ids)."""
        if self.after is None:
            return None
        if not self.after.isdigit() or len(self.after) > 20:  # past any id (and Python's int() digit limit)
            raise ApiError("invalid_argument", _INVALID)
        return int(self.after)

    def cursor_at(self, position: bytes | None) -> str | None:
        """The ``next_cursor`` of a listing that knows where its next page starts (``None``: the end)."""
        return None if position is None else encode_cursor(position)

    def take(self, items: Iterable[T], position: Callable[[T], bytes]) -> tuple[list[T], str | None]:
        """Up to ``limit`` items, and the cursor after the last one when more follow."""
        page = list(islice(items, self.limit + 1))
        if len(page) <= self.limit:
            return page, None
        page = page[: self.limit]
        return page, encode_cursor(position(page[-1]))


async def page_request(
    service: ServiceDep,
    limit: Annotated[int, Query(ge=1, le=10_000, description="page size (capped at the server's maximum)")] = 100,
    # minLength documents what decode_cursor refuses (as invalid_argument, with the other bad cursors).
    cursor: Annotated[
        str | None, Query(description="next_cursor of the previous page", json_schema_extra={"minLength": 1})
    ] = None,
) -> PageRequest:
    return PageRequest(min(limit, service.settings.max_page_size), decode_cursor(cursor))


PageDep = Annotated[PageRequest, Depends(page_request)]
