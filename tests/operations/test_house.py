"""The house rules of the code's words, read statically from the sources.

(a) Every public class of more than 15 lines in the product's folders, and every public
module-level function of more than 15 lines in ``app/``, has a docstring: what it is, what it
owns, why it exists. (b) No comment or docstring in the product's folders, ``tests/`` or
``bench/*.py`` names an issue of this project: the code says what is and why, and the history
of a change is git's. An upstream project's issue, its repository named, is a reference and
allowed. (c) No comment or docstring in the product's folders reads like history ("used to",
"no longer", ...): what is, not what was; the few phrases that state a fact are listed."""

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from tests.support.layers import FOLDERS, sources
from tests.support.server import REPO

# A definition counts as long when its last line is at least this many lines below its first.
LONG = 15


def product_sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in sources(folder))


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


# -- (a) docstrings on the core classes --------------------------------------------------------


def undocumented(source: str, functions: bool = False) -> list[str]:
    """The public classes (and with ``functions``, the public module-level functions) of more
    than ``LONG`` lines in ``source`` without a docstring, as ``line name``."""
    tree = ast.parse(source)
    long: list[ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef] = [
        n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
    ]
    if functions:
        long += [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return [
        f"{n.lineno} {n.name}"
        for n in sorted(long, key=lambda n: n.lineno)
        if not n.name.startswith("_") and (n.end_lineno or n.lineno) - n.lineno >= LONG and ast.get_docstring(n) is None
    ]


def test_long_public_classes_have_docstrings() -> None:
    found = {}
    for path in product_sources():
        name = relative(path)
        missing = undocumented(path.read_text(), functions=name.startswith("app/"))
        if missing:
            found[name] = missing
    assert found == {}


def test_the_docstring_check_catches_a_bare_class() -> None:
    """Self-check: a long public class without a docstring is caught, and so is a long function
    of ``app/``; a short class, a private one and a documented one are not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(LONG))
    source = (
        f"class Bare:\n{body}\n"
        f"class Short:\n    x = 1\n\n"
        f"class _Private:\n{body}\n"
        f'class Told:\n    """What it is."""\n{body}\n'
        f"def long_function():\n{body}"
    )
    assert undocumented(source) == ["1 Bare"]
    assert undocumented(source, functions=True) == ["1 Bare", f"{3 * LONG + 11} long_function"]


# -- the words: comments and docstrings ----------------------------------------------------------


def words(source: str) -> Iterator[tuple[int, str]]:
    """``(line, text)`` of every docstring and of every block of comments on consecutive lines in
    ``source``, whitespace collapsed so that a phrase broken over lines still reads as one."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                yield node.body[0].lineno, " ".join(doc.split())
    # A block: comments alone on their lines, one right below the other; or one after code.
    block: list[str] = []
    start = last = 0
    was_alone = False
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line = token.start[0]
        alone = not token.line[: token.start[1]].strip()
        if block and (line != last + 1 or not alone or not was_alone):
            yield start, " ".join(" ".join(block).split())
            block = []
        if not block:
            start = line
        block.append(token.string.lstrip("#"))
        last, was_alone = line, alone
    if block:
        yield start, " ".join(" ".join(block).split())


# -- (b) no issue numbers ---------------------------------------------------------------------

# An upstream project's issue with its repository named: ``owner/repo#N``, ``repo#N``, or a
# hyphenated or dotted project name before ``issue #N`` (``pytest-xdist issue #N``).
UPSTREAM = re.compile(
    r"[A-Za-z][\w.-]*(?:/[\w.-]+)?#\d+|[A-Za-z]\w*[-.][\w.-]+ issues? #?\d+",
)
# This project's: ``issue N``, ``issues N and M``, ``issue N.M``, ``(#N)``, ``#N``, ``PR N``.
OWN_ISSUE = re.compile(
    r"\bissues?\s*#?\d+(?:\.\d+)*|(?<![\w&/-])#\d+\b|\b(?:PR|pull request)\s*#?\d+",
    re.IGNORECASE,
)


def issue_numbers(text: str) -> list[str]:
    """What in ``text`` names an issue of this project (an upstream one, named, is not)."""
    return OWN_ISSUE.findall(UPSTREAM.sub("", text))


def test_no_comment_names_an_issue() -> None:
    paths = [*product_sources(), *sorted((REPO / "tests").rglob("*.py")), *sorted((REPO / "bench").glob("*.py"))]
    found = [
        f"{relative(path)}:{line}: {numbers}"
        for path in paths
        for line, text in words(path.read_text())
        if (numbers := issue_numbers(text))
    ]
    assert found == []


def test_the_issue_check_catches_a_number() -> None:
    """Self-check: the forms a commit log's number takes are caught, in a comment and in a
    docstring; an upstream project's issue with its repository named is not."""
    source = (
        '"""Raw keyed state (issue 33): streams."""\n'
        "x = 1  # epochs are int64 (issue 27.7)\n"
        "# the first fix (#33), see\n"
        "# issues\n"
        "# 12 and 13\n"
        "y = 2  # nothing here: 27 key groups, step 3.5\n"
        "# pytest 9.2's ids (pytest-xdist issue #1386), (openapi-generators/openapi-python-client#1451)\n"
        "# and openapi-python-client#1451\n"
    )
    found = [(line, issue_numbers(text)) for line, text in words(source)]
    assert [(line, numbers) for line, numbers in found if numbers] == [
        (1, ["issue 33"]),
        (2, ["issue 27.7"]),
        (3, ["#33", "issues 12"]),
    ]


# -- (c) no history in the product's words -------------------------------------------------------

HISTORY = re.compile(
    r"(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )\bused to\b|\bno longer\b|\bonce cost|\bas before\b"
    r"|\bwas ~?\d[\d.,]*(?: ?\S+)? before\b|\bpreviously\b|\bformerly\b|\bany ?more\b|\bused to be\b",
    re.IGNORECASE,
)
# Phrases that match and state a fact, not a change: each one found where it is listed.
FACTS = {
    "backends/checkpointing/registry.py": ["are no longer reachable from any retained checkpoint"],
    "backends/checkpointing/decision.py": [
        "which the replicas no longer list once they serve the new layout's parts",
        "once every old replica committed, they no longer",
    ],
    "backends/topology.py": ["jobs that are no longer on disk"],
    "backends/heap/partition.py": ["after all views are released nothing is copied any more"],
    "client/coordinator.py": ["a fence saw the move its replicas no longer show"],
}


def history(text: str, facts: list[str]) -> list[str]:
    """What in ``text`` reads like history, but for the listed ``facts`` it sits in."""
    for fact in facts:
        text = text.replace(fact, "")
    return [m.group(0) for m in HISTORY.finditer(text)]


def test_no_comment_reads_like_history() -> None:
    found = [
        f"{relative(path)}:{line}: {phrases}"
        for path in product_sources()
        for line, text in words(path.read_text())
        if (phrases := history(text, FACTS.get(relative(path), [])))
    ]
    assert found == []


def test_every_listed_fact_is_still_there() -> None:
    """A listed fact that no longer occurs where it is listed leaves the list."""
    gone = [
        f"{name}: {fact}"
        for name, facts in FACTS.items()
        for fact in facts
        if not any(fact in text for _line, text in words((REPO / name).read_text()))
    ]
    assert gone == []


def test_the_history_check_catches_a_commit_log() -> None:
    """Self-check: history in a comment (also broken over lines) and in a docstring is caught; a
    listed fact, and a thing that "is used to" do something, are not."""
    source = (
        '"""The record.\n\nThose used to be two variables."""\n'
        "x = 1  # the sort once cost 0.7 s; it is used to page\n"
        "# a key that is no\n"
        "# longer owned\n"
        "# the reader, as before, reads a part\n"
        "# the timeout was 135 s before\n"
    )
    found = [(line, history(text, ["a key that is no longer owned"])) for line, text in words(source)]
    assert [(line, phrases) for line, phrases in found if phrases] == [
        (1, ["used to"]),
        (4, ["once cost"]),
        (5, ["as before", "was 135 s before"]),
    ]
