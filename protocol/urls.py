"""Replica URLs, as clients are sent to them: one rule for the client's seeds and for the URLs a
live rescale records on the replicas."""

from __future__ import annotations

from urllib.parse import urlsplit


def check_url(url: str) -> None:
    """A replica URL is ``http(s)://host[:port]``: requests go to the API's own paths on it, so a
    path, query or fragment would be ignored, not prefixed (a proxy under a path is not supported)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises on a bad port
    except ValueError as exc:
        raise ValueError(f"replica URL {url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"replica URL {url!r} must be http(s)://host[:port]")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"replica URL {url!r} must be http(s)://host[:port], without a path, query or fragment")
