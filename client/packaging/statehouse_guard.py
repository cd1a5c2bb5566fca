"""The ``statehouse`` command's entry point: checks the ``statehouse`` import namespace first.

Both distributions (``statehouse-server``, ``statehouse-client``) install into one PEP 420
namespace, ``statehouse``, which has no ``statehouse/__init__.py``. Another project on the package
index is also called ``statehouse`` and ships a regular ``statehouse/__init__.py``: installed in
the same environment it lands in the same ``site-packages/statehouse/`` directory, turns the
namespace into its own package, and every ``statehouse.*`` import then fails inside that
project's ``__init__``. Nothing under ``statehouse`` can run to say why, so this module lives
outside it: the command checks here, says in one line what conflicts and what to do, and only
then imports the command line.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib import metadata
from pathlib import Path

# The exit code of bad usage or a broken installation (statehouse.client.cli.common.EXIT_USAGE).
EXIT_CONFLICT = 2


def conflict() -> str | None:
    """One line naming the package that hides the ``statehouse`` namespace and how to remove it,
    or None when ``statehouse`` is a namespace package (ours). Finds the package without
    importing it: its ``__init__`` is what fails."""
    try:
        spec = importlib.util.find_spec("statehouse")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.submodule_search_locations is None:
        return None
    origin = spec.origin or ""
    if not origin.endswith("__init__.py"):  # a namespace package: ours
        return None
    owner = _owner(Path(origin).resolve())
    if owner is None:  # on sys.path some other way (PYTHONPATH, a directory of that name)
        return (
            f"statehouse: {origin} is no part of statehouse-client or statehouse-server (no installed "
            "distribution records it) and hides their statehouse.* modules; move its statehouse/ out of the path"
        )
    return (
        f"statehouse: {origin} belongs to another project ({owner}) and hides statehouse-client's statehouse.* "
        f"modules; remove it: pip uninstall {owner.split(' ', 1)[0]}"
    )


def _owner(init: Path) -> str | None:
    """``NAME VERSION`` of the installed distribution that owns ``init``, if any records it."""
    for dist in metadata.distributions():
        for file in dist.files or ():
            if file.parts[-2:] == ("statehouse", "__init__.py") and Path(str(dist.locate_file(file))).resolve() == init:
                return f"{dist.metadata['Name']} {dist.version}"
    return None


def main() -> int:
    """The ``statehouse`` console script: the namespace check, then the command line."""
    problem = conflict()
    if problem is not None:
        print(problem, file=sys.stderr)
        return EXIT_CONFLICT
    from statehouse.client.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
