"""The folders of the statehouse namespace are layers, and its modules have no import cycles.

Static: every import statement counts, also those inside functions and under
``if TYPE_CHECKING:``, since an arrow there is still a module that cannot be understood
without the one it names."""

import ast
import subprocess
from pathlib import Path

from tests.support.layers import CHAINS, FOLDERS, sources
from tests.support.server import REPO


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["statehouse", *parts])


def imported_names(source: str, where: str) -> set[str]:
    """Every module or module attribute an import statement anywhere in ``source`` names."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{where}: the project imports absolutely"
            base = node.module
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    return targets


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for folder in FOLDERS for p in sources(folder)}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = imported_names(path.read_text(), str(path))
        # An import of a package's attribute resolves to the module where it exists.
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def private_imports(source: str) -> list[str]:
    """Names with a leading underscore that ``source`` imports from a statehouse module: a
    helper two modules share is public, in a module of its own (e.g. ``client/arrow.py``)."""
    return [
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("statehouse.")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def folder_of(module: str) -> str:
    return module.split(".")[1]


def allowed(importer: str, imported: str) -> bool:
    """Whether folder ``importer`` may import folder ``imported``: itself, or below it in a chain."""
    return importer == imported or any(
        importer in chain and imported in chain and chain.index(imported) < chain.index(importer) for chain in CHAINS
    )


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a folder that is not below the importer's, as ``importer -> imported``."""
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if not allowed(folder_of(name), folder_of(target))
    )


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
    assert "statehouse.protocol.keygroups" in graph["statehouse.client.job"]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_every_folder_is_a_layer():
    """A new top-level package joins a chain (else nothing checks its arrows), under a name that
    no .gitignore rule (such as ``make run``'s ``/checkpoints/``) hides from git."""
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert packages - {"tests", "bench"} == set(FOLDERS)
    ignored = subprocess.run(["git", "check-ignore", *FOLDERS], cwd=REPO, capture_output=True, text=True).stdout
    assert ignored.split() == []


def test_folders_import_only_folders_below():
    assert wrong_way(import_graph()) == []


def test_the_layer_check_catches_an_upward_import():
    """Self-check: an import of a folder above, even one only the type checker sees, is caught;
    so is an import across the two distributions."""
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from statehouse.backends.job import Job\n"
    names = imported_names(source, "snapshots/example.py")
    assert "statehouse.backends.job" in names
    graph = {
        "statehouse.snapshots.example": {"statehouse.backends.job", "statehouse.protocol.keygroups"},
        "statehouse.backends.job": {"statehouse.snapshots.example"},
        "statehouse.client.example": {"statehouse.backends.job", "statehouse.snapshots.example"},
        "statehouse.app.example": {"statehouse.client.job"},
    }
    assert wrong_way(graph) == [
        "statehouse.app.example -> statehouse.client.job",
        "statehouse.client.example -> statehouse.backends.job",
        "statehouse.snapshots.example -> statehouse.backends.job",
    ]


# Inside backends/: what sits below ``Job`` (the backends' interface, the state kinds, the two
# backends with their snapshot strategies and part readers) and what sits above it (the job, its
# catalog, the checkpoint coordinator). A strategy reads a job through
# ``backends.base.snapshot.SnapshotSource``; the coordinator asks a part's reader for its format
# (``backends.snapshot.restore.part_reader``) and the store for its strategy, never a backend's
# own modules.
BELOW_JOB = ("base", "keyed", "heap", "rocksdb", "snapshot")
ABOVE_JOB = ("job", "catalog", "checkpointing")
BACKENDS = ("heap", "rocksdb")


def _within(module: str, packages: tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``statehouse.backends.<package>`` or inside one."""
    return any(module == f"statehouse.backends.{p}" or module.startswith(f"statehouse.backends.{p}.") for p in packages)


def engine_wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """Each import of the job, its catalog or the checkpoint coordinator from below ``Job``, and
    each import of a backend's own modules by the coordinator, as ``importer -> imported``."""
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if (_within(name, BELOW_JOB) and _within(target, ABOVE_JOB))
        or (_within(name, ("checkpointing",)) and _within(target, BACKENDS))
    )


def test_nothing_below_job_imports_it():
    assert engine_wrong_way(import_graph()) == []


def test_the_engine_check_catches_an_import_of_job_from_below():
    """Self-check: a strategy importing ``Job`` (even only for the type checker), a backend
    importing the coordinator, and the coordinator importing RocksDB's modules are caught; a
    module whose name merely starts like one above (``jobs``) and imports going down are not."""
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from statehouse.backends.job import Job\n"
    assert "statehouse.backends.job" in imported_names(source, "backends/snapshot/example.py")
    graph = {
        "statehouse.backends.snapshot.full_strategy": {"statehouse.backends.job", "statehouse.backends.base.snapshot"},
        "statehouse.backends.heap.store": {"statehouse.backends.checkpointing.restore"},
        "statehouse.backends.rocksdb": {"statehouse.backends.catalog", "statehouse.backends.jobs"},
        "statehouse.backends.checkpointing.restore": {
            "statehouse.backends.rocksdb.snapshot",
            "statehouse.backends.snapshot.restore",
            "statehouse.backends.job",
        },
        "statehouse.backends.job": {"statehouse.backends.snapshot.operator_format", "statehouse.backends.heap"},
    }
    assert engine_wrong_way(graph) == [
        "statehouse.backends.checkpointing.restore -> statehouse.backends.rocksdb.snapshot",
        "statehouse.backends.heap.store -> statehouse.backends.checkpointing.restore",
        "statehouse.backends.rocksdb -> statehouse.backends.catalog",
        "statehouse.backends.snapshot.full_strategy -> statehouse.backends.job",
    ]


def test_no_module_imports_another_ones_private_names():
    found = {
        str(path.relative_to(REPO)): names
        for folder in FOLDERS
        for path in sources(folder)
        if (names := private_imports(path.read_text()))
    }
    assert found == {}
    # Self-check: what client/timer_columns.py did before client/arrow.py.
    assert private_imports("from statehouse.client.columns import Columns, _ipc, __all__\n") == [
        "statehouse.client.columns._ipc"
    ]


def test_every_import_is_a_statement():
    """No module loads another by a name in a string (``importlib.import_module``,
    ``__import__``): lazy exports so built once hid a cycle between backends/ and snapshots/
    from these checks. (A deferred import statement, as ``statehouse.client.Columns``', is seen.)"""
    dynamic = [
        str(path.relative_to(REPO))
        for folder in FOLDERS
        for path in sources(folder)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and (getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) == "__import__")
    ]
    assert dynamic == []
