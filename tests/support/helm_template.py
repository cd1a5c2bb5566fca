"""``helm template`` without a helm binary: the chart rendered by helm-python-sdk (the dev venv's
Helm library), printed as one multi-document YAML stream.

    .venv/bin/python -m tests.support.helm_template [-f values.yaml]... [--set key=value]...

Values merge as helm merges them: the chart's defaults, then each ``-f`` file in order, then each
``--set`` (helm's ``--set`` syntax), later ones winning key by key.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import helm_python as hp

CHART = Path(__file__).resolve().parents[2] / "helm" / "statehouse"


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` laid over ``base``: maps merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def template(values: dict[str, Any], name: str, namespace: str, chart: Path = CHART) -> str:
    """The chart's manifests for release ``name`` in ``namespace`` (NOTES.txt left out, as
    ``helm template`` leaves it), each under a ``# Source:`` comment naming its template."""
    loaded = hp.Chart.load(chart)
    try:
        out = loaded.render(values=values, name=name, namespace=namespace, is_install=True)
    finally:
        loaded.close()
    return "".join(
        f"---\n# Source: {path}\n{manifest}\n"
        for path, text in sorted(out.items())
        if path.endswith((".yaml", ".yml")) and (manifest := text.strip().removeprefix("---").strip())
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.helm_template", description=__doc__)
    parser.add_argument("-f", "--values", action="append", default=[], type=Path, help="a values file")
    parser.add_argument("--set", action="append", default=[], dest="sets", help="helm's --set key=value")
    parser.add_argument("--name", default="statehouse", help="the release name (default statehouse)")
    parser.add_argument("--namespace", default="default", help="the release namespace (default default)")
    parser.add_argument("--chart", default=CHART, type=Path, help="the chart's directory")
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for path in args.values:
        values = merge(values, hp.values_from_yaml(path.read_text()))
    for expression in args.sets:
        values = merge(values, hp.parse_set_string(expression))
    print(template(values, args.name, args.namespace, args.chart), end="")


if __name__ == "__main__":
    main()
