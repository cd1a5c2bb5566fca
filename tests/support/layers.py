"""The product's folders as layers, which the import-graph test checks and the packaging test
holds the two distributions to.

The layers, bottom to top, one chain per distribution; a folder imports only folders below it in
a chain holding both. The client distribution (what a Spark executor installs) is its own chain:
nothing of the engine's in it, and the server takes only its bottom: the protocol (key groups, the
op table, the wire's bounds, the domain errors) and the snapshots (formats, checkpoint storage and
the stored-state encoding, which a reader of a checkpoint without a server shares)."""

from pathlib import Path

from tests.support.server import REPO

SERVER_LAYERS = ("protocol", "snapshots", "backends", "app")
CLIENT_LAYERS = ("protocol", "snapshots", "client")
CHAINS = (SERVER_LAYERS, CLIENT_LAYERS)
FOLDERS = tuple(dict.fromkeys(SERVER_LAYERS + CLIENT_LAYERS))
CLIENT_FOLDERS = CLIENT_LAYERS  # client/packaging/pyproject.toml
SERVER_FOLDERS = tuple(f for f in SERVER_LAYERS if f not in CLIENT_FOLDERS)  # pyproject.toml
# Not modules of the namespace: the client distribution's build files.
OUTSIDE = ("client/packaging",)


def sources(folder: str) -> list[Path]:
    """The namespace's Python modules under a product folder."""
    return [p for p in (REPO / folder).rglob("*.py") if not any(p.is_relative_to(REPO / o) for o in OUTSIDE)]
