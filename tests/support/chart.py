"""The Helm chart rendered as helm would install it, into its manifests and its notes."""

from __future__ import annotations

from typing import Any

import yaml

RELEASE, NAMESPACE = "sh", "state"


def render(chart: Any, values: dict) -> tuple[list[dict], str]:
    """The chart (a loaded ``helm_python.Chart``) installed as release ``sh`` in namespace ``state``
    with ``values``: its manifests, and its NOTES.txt."""
    out = chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs, notes = [], ""
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            notes = text
        elif path.endswith((".yaml", ".yml")):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs, notes
