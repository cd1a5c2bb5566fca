"""``STATEHOUSE_ACCESS_LOG``: by default uvicorn's access log leaves out the data plane's
successful requests (the batch, columnar and timer-columnar endpoints: /metrics counts them) and
keeps every other line; ``all`` keeps every line. Real uvicorn, its own log."""

import logging
import re

import pyarrow as pa
import pytest
import urllib3

from statehouse.app.access_log import QuietDataPlane
from statehouse.app.main import app
from statehouse.app.routing import data_plane_paths
from tests.support.arrow_ipc import stream
from tests.support.server import start_server

pytestmark = [pytest.mark.http]

ARROW = {"content-type": "application/vnd.apache.arrow.stream"}


def _requests(url: str) -> None:
    http = urllib3.PoolManager(retries=False)
    assert http.request("PUT", f"{url}/v1/jobs/j", json={}).status == 201
    assert http.request("PUT", f"{url}/v1/jobs/j/states/s", json={"kind": "value"}).status == 201
    body = stream(pa.table({"key": ["a"], "value": [1]}))
    assert http.request("POST", f"{url}/v1/jobs/j/states/s/columns/put", body=body, headers=ARROW).status == 200
    keys = stream(pa.table({"key": ["a"]}))
    assert http.request("POST", f"{url}/v1/jobs/j/states/s/columns/get", body=keys, headers=ARROW).status == 200
    assert (
        http.request("POST", f"{url}/v1/jobs/j/batch", json={"ops": [{"op": "get", "state": "s", "key": "a"}]}).status
        == 200
    )
    assert (
        http.request("POST", f"{url}/v1/jobs/j/batch", json={"ops": [{"op": "get", "state": "x", "key": "a"}]}).status
        == 404
    )
    assert http.request("GET", f"{url}/v1/jobs/j/states/s/keys/a").status == 200


def _logged(log: str) -> list[tuple[str, str, str]]:
    return re.findall(r'"([A-Z]+) (\S+) HTTP/1.1" (\d+)', log)


@pytest.mark.parametrize("mode", [None, "all"])
def test_the_data_planes_successful_requests_are_logged_only_with_all(tmp_path, mode):
    server = start_server(tmp_path, {"STATEHOUSE_BACKEND": "heap"} | ({"STATEHOUSE_ACCESS_LOG": mode} if mode else {}))
    try:
        _requests(server.url)
    finally:
        server.stop()
    logged = _logged(server.log())
    assert ("PUT", "/v1/jobs/j", "201") in logged and ("GET", "/v1/jobs/j/states/s/keys/a", "200") in logged
    assert ("POST", "/v1/jobs/j/batch", "404") in logged  # refused: always logged
    quiet = [
        ("POST", "/v1/jobs/j/states/s/columns/put", "200"),
        ("POST", "/v1/jobs/j/states/s/columns/get", "200"),
        ("POST", "/v1/jobs/j/batch", "200"),
    ]
    for line in quiet:
        assert (line in logged) == (mode == "all"), line


def test_the_data_plane_is_the_routes_flagged_so():
    assert set(data_plane_paths(app.routes)) == {
        "/v1/jobs/{job}/batch",
        "/v1/jobs/{job}/states/{state}/columns/{op}",
        "/v1/jobs/{job}/columns/{op}",
        "/v1/jobs/{job}/timers/{domain}/columns/{op}",
    }


def test_the_routes_answered_beside_asgi_are_the_data_plane():
    """Those routes' successes are left out of the log by their status alone (``app/serve.py``):
    the fast routes must be the routes flagged as the data plane, no more."""
    assert app.data_plane is not None
    assert {fast.route.path for fast in app.data_plane.routes.routes} == set(data_plane_paths(app.routes))


def test_the_filter_reads_uvicorns_access_record():  # the app made (imported above) gave the routes
    def record(method: str, path: str, status: int) -> logging.LogRecord:
        args = ("127.0.0.1:5000", method, path, "1.1", status)
        return logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d', args, None)

    keep = QuietDataPlane().filter
    assert not keep(record("POST", "/v1/jobs/j/timers/event/columns/register", 200))
    assert not keep(record("POST", "/prefix/v1/jobs/j/states/s/columns/add?epoch=3&seq=1", 200))
    assert not keep(record("POST", "/v1/jobs/j/columns/add_get?states=total,events&epoch=3", 200))
    assert keep(record("POST", "/v1/jobs/j/columns/add_get?states=total,events", 400))
    assert keep(record("POST", "/v1/jobs/j/states/s/columns/add", 409))
    assert keep(record("POST", "/v1/jobs/j/epochs/3/commit", 200))
    assert keep(record("GET", "/v1/jobs/j/batch", 405))
    assert keep(record("POST", "/v1/jobs/batch-job/checkpoints", 200))
    assert keep(record("POST", "/v1/jobs/j/states/s/columns/add/more", 200))
    assert not keep(record("POST", "/v1/jobs/j/batch", 200))
    assert keep(logging.LogRecord("uvicorn.access", logging.INFO, "", 0, "other", None, None))
