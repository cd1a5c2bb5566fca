"""The route table both sides share (``protocol/routes.py``) against the app that serves it: every
template the client fills in is a path the server routes, and the fast path's patterns match what
FastAPI's router matches."""

from __future__ import annotations

import pytest

from statehouse.app.main import create_app
from statehouse.app.settings import Settings
from statehouse.protocol import routes

# Every path template of the table (the API's prefix itself is none).
PATHS = {
    name: value
    for name, value in vars(routes).items()
    if name.isupper() and isinstance(value, str) and value.startswith(routes.API + "/")
}


def served_paths() -> set[str]:
    return set(create_app(Settings()).openapi()["paths"])


def test_every_template_is_a_served_path() -> None:
    served = served_paths()
    steps = {routes.path(routes.TOPOLOGY_STEP, step=step) for step in routes.TOPOLOGY_STEPS}
    assert steps <= served
    unserved = {name: p for name, p in PATHS.items() if p not in served and p != routes.TOPOLOGY_STEP}
    assert not unserved, f"protocol/routes.py names paths the app does not serve: {unserved}"
    assert len(PATHS) > 25  # the table is read, not skipped: a renamed module would leave it empty


def test_the_server_routes_its_live_rescale_steps_and_nothing_else_there() -> None:
    served = {p for p in served_paths() if p.startswith(routes.TOPOLOGY + "/")}
    assert served == {routes.TOPOLOGY_DECISION} | {f"{routes.TOPOLOGY}/{s}" for s in routes.TOPOLOGY_STEPS}


def test_path_fills_every_parameter_and_refuses_a_missing_or_extra_one() -> None:
    assert routes.path(routes.STATE_SCAN, job="j", state="s") == "/v1/jobs/j/states/s/scan"
    assert routes.path(routes.TOPOLOGY) == "/v1/topology"
    with pytest.raises(KeyError, match="state"):
        routes.path(routes.STATE_SCAN, job="j")
    with pytest.raises(KeyError, match="stat"):
        routes.path(routes.JOB, job="j", stat="s")


@pytest.mark.parametrize(
    ("template", "path", "groups"),
    [
        (routes.STATE_COLUMNS, "/v1/jobs/j/states/s/columns/get", {"job": "j", "state": "s", "op": "get"}),
        (routes.JOB_COLUMNS, "/v1/jobs/j.1/columns/add_get", {"job": "j.1", "op": "add_get"}),
        (routes.STATE_COLUMNS, "/v1/jobs/j/states/s/columns/get/more", None),
        (routes.STATE_COLUMNS, "/v1/jobs/j/states//columns/get", None),
        (routes.JOB_COLUMNS, "/v1/jobsXj/columns/get", None),
        (routes.JOB_COLUMNS, "/v1/jobs/j/states/s/columns/get", None),
    ],
)
def test_pattern_matches_one_segment_per_parameter(template: str, path: str, groups: dict[str, str] | None) -> None:
    match = routes.pattern(template).fullmatch(path)
    assert (match.groupdict() if match else None) == groups
