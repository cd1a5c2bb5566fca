"""The pages of the problem codes: what each code means and what to do, served by every replica.

A problem's ``type`` is ``/problems/{code}`` (a relative reference, RFC 9457 §3.1.1), so it
resolves on the replica that answered, with no other site involved. The text is ``problems.md``
beside this module: one table of every code, the only place it is written (docs/api.md links to
it). Its inline markdown is rendered here, as little as it uses: code spans, links, ``<sup>``.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from functools import cache
from http import HTTPStatus
from importlib.resources import files

PAGES = "/problems"
SOURCE = "problems.md"

# One row of the table: | <a id="CODE"></a>`CODE` | STATUS | what it means | what to do |
_ROW = re.compile(
    r'^\| <a id="(?P<code>[a-z_]+)"></a>`(?P=code)` \| (?P<status>\d{3}|any) \| (?P<means>[^|]+) \| (?P<todo>[^|]+) \|$'
)
_LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")
_CODE_SPAN = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class ProblemPage:
    """One code's entry: its HTTP status (None: any), what it means and what to do, as markdown."""

    code: str
    status: int | None
    means: str
    todo: str

    @property
    def status_text(self) -> str:
        return "any status" if self.status is None else f"{self.status} {HTTPStatus(self.status).phrase}"


@cache
def pages() -> dict[str, ProblemPage]:
    """Every code's entry of ``problems.md``, in its order."""
    text = files("statehouse.app").joinpath(SOURCE).read_text(encoding="utf-8")
    found: dict[str, ProblemPage] = {}
    for line in text.splitlines():
        row = _ROW.match(line)
        if row is not None:
            status = None if row["status"] == "any" else int(row["status"])
            found[row["code"]] = ProblemPage(row["code"], status, row["means"], row["todo"])
    return found


def page_path(code: str, root_path: str = "") -> str:
    """The path of a code's page (behind a proxy's ``root_path`` when there is one)."""
    return f"{root_path}{PAGES}/{code}"


def inline(markdown: str, root_path: str = "") -> str:
    """HTML of one table cell: code spans and ``<sup>`` kept, everything else escaped. A link to
    another code's entry goes to its page; a link into docs/ (not served) becomes its text and
    the document it names."""
    parts: list[str] = []
    last = 0
    for link in _LINK.finditer(markdown):
        parts.append(_text(markdown[last : link.start()]))
        target, text = link["target"], _text(link["text"])
        if target.startswith("#") and target[1:] in pages():
            parts.append(f'<a href="{html.escape(page_path(target[1:], root_path))}">{text}</a>')
        else:
            parts.append(f"{text} (<cite>{html.escape(target.removeprefix('../'))}</cite>)")
        last = link.end()
    parts.append(_text(markdown[last:]))
    return "".join(parts)


def _text(markdown: str) -> str:
    escaped = html.escape(markdown, quote=False)
    escaped = escaped.replace("&lt;sup&gt;", "<sup>").replace("&lt;/sup&gt;", "</sup>")
    return _CODE_SPAN.sub(lambda m: f"<code>{m[1]}</code>", escaped)


_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.5}"
    "code{background:#f3f3f3;padding:0 .2em}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:.3rem .5rem;vertical-align:top;text-align:left}"
)


def _document(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{body}</body></html>"
    )


def render_page(page: ProblemPage, root_path: str = "") -> str:
    """One code's page: its status, what it means, what to do."""
    return _document(
        f"Statehouse problem: {page.code}",
        f"<h1><code>{page.code}</code></h1><p>HTTP {html.escape(page.status_text)}</p>"
        f"<h2>What it means</h2><p>{inline(page.means, root_path)}</p>"
        f"<h2>What to do</h2><p>{inline(page.todo, root_path)}</p>"
        f'<p><a href="{root_path}{PAGES}">Every problem code</a> · <a href="{root_path}/docs">The API</a></p>',
    )


def render_index(root_path: str = "") -> str:
    """Every code: its status and what it means, each linking to its page."""
    rows = "".join(
        f'<tr><td><a href="{html.escape(page_path(p.code, root_path))}"><code>{p.code}</code></a></td>'
        f"<td>{p.status or 'any'}</td><td>{inline(p.means, root_path)}</td></tr>"
        for p in pages().values()
    )
    return _document(
        "Statehouse problem codes",
        "<h1>Problem codes</h1><p>Every error is <code>application/problem+json</code> with a stable "
        "<code>code</code>; its <code>type</code> is the code's page here. Branch on <code>code</code>, "
        "not on <code>detail</code>.</p>"
        f"<table><tr><th>code</th><th>status</th><th>what it means</th></tr>{rows}</table>"
        f'<p><a href="{root_path}/docs">The API</a></p>',
    )
