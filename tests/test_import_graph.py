"""No import cycles between the modules of the statehouse namespace (static: every import
statement counts, also those under ``if TYPE_CHECKING:``, since a cycle there is still two
modules that cannot be understood one without the other)."""

import ast
from pathlib import Path

from harness.server import REPO

FOLDERS = ("app", "backends", "snapshots", "client", "keygroups", "pipelines")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["statehouse", *parts])


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for folder in FOLDERS for p in (REPO / folder).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0 and node.module, f"{path}: the project imports absolutely"
                base = node.module
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        # An import of a package's attribute resolves to the module where it exists.
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_imports():
    graph = import_graph()
    assert "statehouse.client.transport" in graph["statehouse.client.replicas"]
    assert "statehouse.keygroups" in graph["statehouse.client.job"]


def test_no_import_cycles():
    assert cycles(import_graph()) == []
