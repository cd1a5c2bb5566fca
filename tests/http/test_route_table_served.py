"""The other direction of ``tests/http/test_routes.py``: every path the app serves under the API's
prefix (and its probes) is a template of ``protocol/routes.py``, and no router spells a path of its
own beside the table, so a route added or renamed in a router changes the table the client reads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from fastapi import routing

from statehouse.app.main import create_app
from statehouse.app.settings import Settings
from statehouse.protocol import routes

ROUTERS = Path(__file__).resolve().parents[2] / "app" / "routers"
# The human pages (Swagger UI, ReDoc, the problem codes) are the server's alone: no client fills
# them in, so their router names its own paths.
OWN_PATHS = {"docs.py"}
PROBES = {routes.HEALTHZ, routes.READYZ, routes.METRICS}
# A string that reads as a path: a slash, then a name or a parameter.
_PATH_LIKE = re.compile(r"/[\w{]")


def table() -> set[str]:
    """Every path the table names, the live rescale's steps filled in."""
    templates = {value for name, value in vars(routes).items() if name.isupper() and isinstance(value, str)}
    steps = {routes.path(routes.TOPOLOGY_STEP, step=step) for step in routes.TOPOLOGY_STEPS}
    return {t for t in templates if t.startswith("/")} | steps


def served() -> set[str]:
    """The path of every route of the app under the API's prefix, and the probes."""
    paths = {c.path for c in routing.iter_route_contexts(create_app(Settings()).routes) if c.path is not None}
    return {p for p in paths if p.startswith(routes.API + "/") or p in PROBES}


def path_literals(source: str) -> list[str]:
    """The strings in ``source`` (docstrings aside) that read as paths."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and _PATH_LIKE.match(node.value)
    ]


def test_every_served_api_path_is_a_template_of_the_table() -> None:
    paths = served()
    assert paths >= PROBES
    assert len(paths) > 40  # the app's routes are read: an empty walk would pass anything
    assert not paths - table(), f"routes served but missing from protocol/routes.py: {sorted(paths - table())}"


def test_no_router_spells_a_path_beside_the_table() -> None:
    modules = sorted(ROUTERS.glob("*.py"))
    assert len(modules) > 10
    found = {m.name: path_literals(m.read_text()) for m in modules if m.name not in OWN_PATHS}
    spelled = {name: literals for name, literals in found.items() if literals}
    assert not spelled, f"paths spelled outside protocol/routes.py: {spelled}"


def test_path_literals_finds_a_route_path_and_leaves_docstrings_and_other_strings() -> None:
    example = '''
"""Routes of /v1/jobs."""
BASE = "/jobs/{job}"


@router.get(BASE + "/keys")
async def keys() -> None:
    """Lists /v1/jobs/{job}/keys."""
    return "a/b".split("/")
'''
    assert sorted(path_literals(example)) == ["/jobs/{job}", "/keys"]
