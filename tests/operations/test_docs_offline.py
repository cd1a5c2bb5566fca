"""/docs and /redoc render with no internet: a real server, rendered by headless Chromium.

Chromium runs with every host name but 127.0.0.1 unresolvable, so an asset still loaded from
a CDN would leave the page blank, and its network log shows every request the page made.
Without Chromium the browser tests fail (CI installs it, see .ci/run), unless
STATEHOUSE_SKIP_BROWSER=1.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.server import start_server

pytestmark = [pytest.mark.http]

TOKEN = "docs-test-token"
BROWSER_TIMEOUT = 90  # seconds for one page; a render takes a few
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # Auth on: the pages and the OpenAPI document must stay open anyway.
    srv = start_server(
        tmp_path_factory.mktemp("docs-server"), {"STATEHOUSE_BACKEND": "heap", "STATEHOUSE_API_TOKENS": TOKEN}
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def openapi(server) -> dict:
    response = httpx.get(server.url + "/openapi.json", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def operations(openapi: dict) -> list[tuple[str, str, str]]:
    """(method, path, operationId) of every operation in the document."""
    return [
        (method, path, op["operationId"])
        for path, item in openapi["paths"].items()
        for method, op in item.items()
        if method in HTTP_METHODS
    ]


@pytest.fixture(scope="module")
def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    if os.environ.get("STATEHOUSE_SKIP_BROWSER") == "1":
        pytest.skip("no chromium, and STATEHOUSE_SKIP_BROWSER=1")
    pytest.fail(
        "chromium is not installed, so /docs and /redoc cannot be checked offline: "
        "apt-get install chromium (.ci/run does), or set STATEHOUSE_SKIP_BROWSER=1 to skip",
        pytrace=False,
    )


def render(chromium: str, url: str, workdir: Path) -> tuple[str, list[str]]:
    """The DOM of ``url`` after its scripts ran, and the URLs of the requests the page made.

    Only 127.0.0.1 resolves. Chromium's own background requests (updates, accounts) are left out
    of the list: the page's requests are those with the server as initiator, plus the page itself.
    """
    workdir.mkdir(parents=True)
    netlog = workdir / "netlog.json"
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={workdir / 'profile'}",
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        f"--log-net-log={netlog}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        url,
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        dom, stderr = process.communicate(timeout=BROWSER_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=10)
        pytest.fail(f"chromium did not render {url} within {BROWSER_TIMEOUT}s")
    finally:
        with contextlib.suppress(ProcessLookupError):  # helpers of this browser that outlived it
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, f"chromium exited with {process.returncode}:\n{stderr[-3000:]}"
    return dom, page_requests(netlog, url)


def page_requests(netlog: Path, page_url: str) -> list[str]:
    log = json.loads(netlog.read_text())
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(page_url))
    urls = []
    for event in log["events"]:
        params = event.get("params", {})
        if event["type"] == start_job and (params.get("initiator") == origin or params.get("url") == page_url):
            urls.append(params["url"])
    return urls


def assert_only_local(requests: list[str], server_url: str, expected: set[str]) -> None:
    outside = [u for u in requests if not u.startswith(server_url + "/")]
    assert not outside, f"the page requested other hosts: {outside}"
    # The log is read right: the page's own assets are in it.
    assert expected <= {urlsplit(u).path for u in requests}, requests


# -- plain HTTP: the pages name no other host and stay open ----------------------------------------


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_page_references_no_external_host(server, page):
    response = httpx.get(server.url + page, timeout=10)  # no token: open like /openapi.json
    assert response.status_code == 200
    html = response.text
    assert not re.findall(r"https?://[^\s\"'<>]*", html), html
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assets.remove("/problems")  # the one link out: the problem codes' pages (tests/http/test_problem_pages.py)
    assert any(a.endswith(".js") for a in assets), html
    assert any("favicon" in a for a in assets), html
    for asset in assets:
        assert asset.startswith("/docs/static/"), asset
        fetched = httpx.get(server.url + asset, timeout=10)
        assert fetched.status_code == 200, asset
        assert len(fetched.content) > 1000, asset
    assert "default-src 'self'" in response.headers["content-security-policy"]


def test_docs_stay_open_when_auth_is_on(server):
    assert httpx.get(server.url + "/v1/jobs", timeout=10).status_code == 401
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect", "/docs/static/swagger-ui.css"):
        assert httpx.get(server.url + path, timeout=10).status_code == 200, path


def test_swagger_ui_keeps_authorization(server):
    html = httpx.get(server.url + "/docs", timeout=10).text
    assert '"persistAuthorization": true' in html
    assert "oauth2RedirectUrl: window.location.origin + '/docs/oauth2-redirect'" in html


# -- a real browser without the internet -------------------------------------------------------------


@pytest.mark.browser
def test_swagger_ui_renders_offline(server, openapi, chromium, tmp_path):
    dom, requests = render(chromium, server.url + "/docs", tmp_path / "docs")
    ops = operations(openapi)
    assert len(ops) > 10
    # One opblock per operation, each naming its path.
    blocks = re.findall(r'class="opblock opblock-(\w+)', dom)
    assert len(blocks) == len(ops), f"{len(blocks)} operations rendered of {len(ops)}:\n{dom[:3000]}"
    paths = set(re.findall(r'class="opblock-summary-path" data-path="([^"]+)"', dom))
    assert paths == {path for _, path, _ in ops}
    assert {"/v1/jobs/{job}", "/v1/jobs/{job}/batch", "/v1/jobs/{job}/checkpoints"} <= paths
    assert_only_local(
        requests,
        server.url,
        {"/docs", "/docs/static/swagger-ui-bundle.js", "/docs/static/swagger-ui.css", "/openapi.json"},
    )


@pytest.mark.browser
def test_redoc_renders_offline(server, openapi, chromium, tmp_path):
    dom, requests = render(chromium, server.url + "/redoc", tmp_path / "redoc")
    ops = operations(openapi)
    # ReDoc gives each operation a section "operation/<operationId>" and shows its method and path.
    missing = [op_id for _, _, op_id in ops if f'operation/{op_id}"' not in dom]
    assert not missing, f"ReDoc rendered no section for {missing}:\n{dom[:3000]}"
    verbs = re.findall(r'class="[^"]*\bhttp-verb (\w+)"[^>]*>\w+</span><span[^>]*>([^<]+)</span>', dom)
    assert {(m, p) for m, p, _ in ops} <= set(verbs)
    assert ("get", "/v1/jobs/{job}") in verbs
    assert_only_local(requests, server.url, {"/redoc", "/docs/static/redoc.standalone.js", "/openapi.json"})
