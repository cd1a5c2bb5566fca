"""Validation of user-chosen names (jobs, states, operators) before they reach storage."""

from __future__ import annotations

import re

from statehouse.protocol.errors import InvalidName

NAME_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"
_NAME_RE = re.compile(NAME_PATTERN[1:-1])  # fullmatch: "$" would also match before a final newline


def validate_name(name: str, what: str) -> str:
    """Names become directory and column-family names: no separators, no ``.``/``..``."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise InvalidName(
            f"{what} name {name!r} is invalid: use 1-128 characters from A-Z a-z 0-9 . _ - (and not '.' or '..')"
        )
    return name
