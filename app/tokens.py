"""Bearer tokens and what each may reach: parsed once, at settings load.

``STATEHOUSE_API_TOKENS`` (and each line of ``STATEHOUSE_API_TOKENS_FILE``) is a comma-separated
list of entries; an entry is ``TOKEN`` or ``TOKEN:SCOPE+SCOPE...``. A scope is a job name, ``*``
(every job) or ``@admin`` (every job, and restores from ``STATEHOUSE_RESTORE_LOCATIONS``). A plain
``TOKEN`` is ``TOKEN:*``: every job, not admin.

Why these separators: entries are comma-separated, so scopes cannot be; ``:`` and ``+``
never occur in job names, ``:`` occurs in none of the usual token alphabets (hex, base64,
base64url, UUIDs, JWTs), and ``@`` cannot start a job name, so ``@admin`` is never a job called
``admin``. Error messages name the entry by position and never echo a token.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from statehouse.snapshots.stored.names import NAME_PATTERN

ALL_JOBS = "*"
ADMIN = "@admin"
_NAME = re.compile(NAME_PATTERN)
_TOKEN = re.compile(r"^[\x21-\x7e]+$")  # visible ASCII: what an Authorization header can carry as is


@dataclass(frozen=True)
class Grant:
    """What one token may reach."""

    jobs: frozenset[str] = frozenset()
    all_jobs: bool = False
    admin: bool = False  # every job, and restores from the operator's extra restore locations

    def allows(self, job: str) -> bool:
        return self.all_jobs or self.admin or job in self.jobs

    def describe(self) -> str:
        if self.admin:
            return ADMIN
        if self.all_jobs:
            return ALL_JOBS
        return "+".join(sorted(self.jobs))


OPEN = Grant(all_jobs=True, admin=True)  # auth off: no identities, the operator's settings decide


def digest(token: bytes) -> bytes:
    """Tokens are compared as SHA-256 digests: equal lengths, so the comparison reveals no length."""
    return hashlib.sha256(token).digest()


def grant_of(token: bytes, digests: list[tuple[bytes, Grant]]) -> Grant | None:
    """The grant of a presented token, or ``None``: compared as SHA-256 digests with
    ``secrets.compare_digest`` against every configured token (no early exit), so neither timing
    nor length tells which bytes matched."""
    presented = digest(token)
    found: Grant | None = None
    for candidate, grant in digests:
        if secrets.compare_digest(presented, candidate):
            found = grant
    return found


class TokenError(ValueError):
    pass


def parse_scopes(text: str) -> Grant:
    """The grant of a token's ``SCOPE+SCOPE...``: job names, ``*`` (every job) and ``@admin``;
    a ``TokenError`` for an empty or invalid scope."""
    jobs: set[str] = set()
    all_jobs = admin = False
    for scope in text.split("+"):
        scope = scope.strip()
        if scope == ALL_JOBS:
            all_jobs = True
        elif scope == ADMIN:
            admin = True
        elif _NAME.match(scope) and scope not in (".", ".."):
            jobs.add(scope)
        elif not scope:
            raise TokenError("has an empty scope (scopes are separated by '+')")
        else:
            raise TokenError(f"has an invalid scope {scope!r}: use job names, '*' (every job) or '@admin'")
    return Grant(frozenset(jobs), all_jobs, admin)


def parse_entry(entry: str) -> tuple[str, Grant]:
    """``TOKEN`` or ``TOKEN:SCOPES`` → the token and its grant (``TokenError`` says what is wrong)."""
    token, colon, scopes = entry.partition(":")
    token = token.strip()
    if not token:
        raise TokenError("has no token before ':'")
    if not _TOKEN.match(token):
        raise TokenError("has a token that is not visible ASCII (no spaces, no control or non-ASCII characters)")
    return token, (parse_scopes(scopes) if colon else Grant(all_jobs=True))


def parse_tokens(variable: str, file: tuple[str, list[str]] | None = None) -> dict[str, Grant]:
    """``STATEHOUSE_API_TOKENS`` and, if given, a token file (a name for messages, and its lines)
    → token → grant.

    Entries are separated by commas (and, in the file, by lines); empty entries and file lines
    starting with ``#`` are skipped. A token listed twice is an error: its two grants would be
    ambiguous.
    """
    grants: dict[str, Grant] = {}
    seen_at: dict[str, str] = {}
    sources: list[tuple[str, list[tuple[int | None, str]]]] = [("STATEHOUSE_API_TOKENS", [(None, variable)])]
    if file is not None:
        sources.append((file[0], list(enumerate(file[1], 1))))
    for source, lines in sources:
        for line_number, line in lines:
            if line.strip().startswith("#"):
                continue
            entries = [e for e in line.split(",") if e.strip()]
            for entry_number, entry in enumerate(entries, 1):
                where = f"entry {entry_number}" if line_number is None else f"line {line_number}, entry {entry_number}"
                try:
                    token, grant = parse_entry(entry)
                except TokenError as exc:
                    raise TokenError(f"{source}: {where} {exc}") from None
                if token in grants:
                    raise TokenError(f"{source}: {where} repeats the token of {seen_at[token]}")
                grants[token] = grant
                seen_at[token] = f"{source} {where}"
    return grants
