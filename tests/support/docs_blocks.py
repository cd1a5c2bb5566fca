"""The code blocks of a markdown page (fenced, and indented shell blocks), each with the
``<!-- docs-test: ... -->`` marker on the line before it, and the output a block shows it prints."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.support.server import REPO

RUN = {"sh": "bash", "bash": "bash", "python": "python"}


NOT_CODE = {"json", "mermaid", "yaml", ""}  # data, diagrams and layouts: shown, not run


MARKER = re.compile(r"<!--\s*docs-test:\s*(\w+)\s*(.*?)\s*-->")


FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


LIST_ITEM = re.compile(r"^\s*([-*+]|\d+\.)\s")


EXPECTED = re.compile(r"#\s*([\[{].*)$")


@dataclass
class Block:
    page: str
    line: int
    language: str  # "bash" or "python"
    code: str
    marker: str | None  # "skip", "spark" or None
    reason: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def parse(path: Path) -> list[Block]:
    """The page's fenced and indented code blocks, with the marker on the line before each."""
    page = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    previous = ""  # the last non-blank line before the current one
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            indent, language = fence.groups()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            code = "\n".join(body[len(indent) :] for body in lines[i + 1 : end]) + "\n"
            blocks.append(_block(page, i + 1, language, code, previous))
            previous, i = "```", end + 1
            continue
        indented = line.startswith("    ") and line.strip() and i > 0 and not lines[i - 1].strip()
        if indented and not LIST_ITEM.match(previous) and not previous.startswith((" ", "|")):
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            code = "\n".join(body[4:] for body in lines[i:end]).strip() + "\n"
            blocks.append(_block(page, i + 1, "sh", code, previous))
            previous, i = code, end
            continue
        if line.strip():
            previous = line
        i += 1
    return blocks


def _block(page: str, line: int, language: str, code: str, previous: str) -> Block:
    marker = MARKER.search(previous)
    if language not in RUN and language not in NOT_CODE:
        raise AssertionError(f"{page}:{line}: a ```{language} block: use sh, bash or python (run) or mark it")
    return Block(
        page,
        line,
        RUN.get(language, ""),
        code,
        marker.group(1) if marker else None,
        marker.group(2).strip("() ") if marker else "",
    )


def parse_page(path: Path) -> list[Block]:
    """The blocks this test runs (shell and Python) or skips by their marker."""
    return [block for block in parse(path) if block.language]


def expected_output(code: str) -> list[str]:
    return [m.group(1).strip() for line in code.splitlines() if (m := EXPECTED.search(line))]


def check_output(block: Block, stdout: str) -> None:
    position = 0
    for expected in expected_output(block.code):
        found = stdout.find(expected, position)
        assert found >= 0, f"{block.id}: {expected!r} not in the output after position {position}:\n{stdout}"
        position = found + len(expected)
