"""The admin steps of a live rescale authorise before they read or validate a body, as every
route under a job does: a token that is not @admin gets 403 `forbidden` whatever it sends (an
invalid body, malformed JSON, or a body it never sends), and learns nothing from the body's
errors."""

from __future__ import annotations

import httpx
import pytest

from tests.support.raw_http import status_before_the_body
from tests.support.server import start_server

pytestmark = [pytest.mark.http]

ADMIN, USER = "admin-secret", "user-secret"
# The steps that refuse a non-admin token before its body.
STEPS = ["prepare", "catch-up", "load", "decide", "commit", "abort"]
INVALID = {
    "prepare": [{}, {"version": 0, "replica_count": 2}, {"version": 2, "replica_count": 2, "replica_urls": ["x"]}, []],
    "catch-up": [{}, {"version": 0}, {"version": "x"}, []],
    "load": [{}, {"version": 0, "checkpoints": {"j": 0}}, {"version": "x"}, []],
    "decide": [{}, {"version": 2, "outcome": "maybe"}, {"version": -1, "outcome": "commit"}, "text"],
    "commit": [{}, {"version": 0}, {"version": "x"}, []],
    "abort": [{}, {"version": 0}, {"version": "x"}, []],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start_server(
        tmp_path_factory.mktemp("admin"),
        {"STATEHOUSE_BACKEND": "heap", "STATEHOUSE_API_TOKENS": f"{ADMIN}:@admin,{USER}"},
    )
    yield server
    server.stop()
    assert "Traceback" not in server.log()


def forbidden(response: httpx.Response) -> None:
    assert response.status_code == 403, response.text
    assert response.json()["code"] == "forbidden"
    assert "@admin" in response.json()["detail"]


@pytest.mark.parametrize("step", STEPS)
def test_a_non_admin_token_is_refused_whatever_its_body(server, step):
    url = f"{server.url}/v1/topology/{step}"
    as_user = {"Authorization": f"Bearer {USER}"}
    for body in INVALID[step]:
        forbidden(httpx.post(url, json=body, headers=as_user, timeout=30))
    malformed = {**as_user, "content-type": "application/json"}
    forbidden(httpx.post(url, content=b'{"version": ', headers=malformed, timeout=30))
    # Refused before the body is received: the request's head alone is answered.
    assert status_before_the_body(server.url, "POST", f"/v1/topology/{step}", malformed, length=1024) == 403
    # An admin token's invalid body is still a 422 naming what is wrong.
    as_admin = {"Authorization": f"Bearer {ADMIN}"}
    invalid = httpx.post(url, json=INVALID[step][1], headers=as_admin, timeout=30)
    assert invalid.status_code == 422, invalid.text
    # No token at all: 401 before anything.
    assert httpx.post(url, json=INVALID[step][0], timeout=30).status_code == 401


def test_reading_a_decision_needs_an_admin_token_whatever_its_query(server):
    url = f"{server.url}/v1/topology/decision"
    for params in ({"version": "x"}, {"version": 0}, {}):
        forbidden(httpx.get(url, params=params, headers={"Authorization": f"Bearer {USER}"}, timeout=30))
    refused = httpx.get(url, params={"version": "x"}, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert refused.status_code == 422, refused.text
