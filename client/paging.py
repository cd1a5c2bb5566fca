"""Cursor paging, as every paged answer of the API works: ask for a page, and again with the
cursor it names, until a page names none. Listings carry it as ``next_cursor`` in their JSON;
a scan page carries it in its Arrow schema metadata (``protocol.routes.NEXT_CURSOR``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from statehouse.protocol.routes import LISTING_PAGE

if TYPE_CHECKING:
    from statehouse.client.transport import ReplicaConnection

P = TypeVar("P")


def follow(fetch: Callable[[str | None], P], next_cursor: Callable[[P], str | None]) -> Iterator[P]:
    """Every page: ``fetch(None)`` first, then ``fetch(cursor)`` with the cursor the previous page
    names (``next_cursor(page)``), until one names none."""
    cursor: str | None = None
    while True:
        page = fetch(cursor)
        yield page
        cursor = next_cursor(page)
        if cursor is None:
            return


def listing(
    connection: ReplicaConnection,
    path: str,
    params: Mapping[str, Any] | None = None,
    *,
    limit: int = LISTING_PAGE,
) -> Iterator[dict[str, Any]]:
    """Every page of one replica's JSON listing at ``path`` (``items``, ``next_cursor`` and whatever
    else the listing answers), ``limit`` items a page at most, with the query ``params``."""

    def fetch(cursor: str | None) -> dict[str, Any]:
        query = {"limit": limit, **(params or {}), **({"cursor": cursor} if cursor else {})}
        page: dict[str, Any] = json.loads(connection.request("GET", path, idempotent=True, params=query).content)
        return page

    return follow(fetch, lambda page: page["next_cursor"])


def listed(
    connection: ReplicaConnection, path: str, params: Mapping[str, Any] | None = None, *, limit: int = LISTING_PAGE
) -> Iterator[Any]:
    """Every item of one replica's JSON listing at ``path``, page after page."""
    for page in listing(connection, path, params, limit=limit):
        yield from page["items"]
