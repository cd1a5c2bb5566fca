"""Every problem's ``type`` is a page the service serves itself: ``/problems/{code}``, what the code
means and what to do, from the one table app/problems.md; and nothing the project ships names
another project's domain or tells users to install a name that is not ours."""

from __future__ import annotations

import re
import subprocess

import httpx
import pytest

from statehouse.app.problem_pages import inline, pages, render_page
from statehouse.app.problems import STATUS_BY_CODE, problem_type
from tests.support.server import REPO

pytestmark = [pytest.mark.http]

# The package index's `statehouse` (statehouse.dev) is another project.
OTHER_DOMAIN = re.compile(r"statehouse\.dev")
INSTALLS_OTHER = re.compile(r"pip3? install +(?:-\S+ +)*['\"]?statehouse(?![\w-])")
# Outside this module's reach, each to be fixed where it lives: the setting's default value (read as
# "not set" by app/problems.py) and the chart's home, icon and label key.


def shipped_text_files() -> dict[str, str]:
    """Every tracked text file but the tests (which name the other project to test against it)."""
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    found = {}
    for name in names:
        if name.startswith("tests/"):
            continue
        try:
            found[name] = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
    return found


def offenders(files: dict[str, str]) -> dict[str, list[str]]:
    return {
        name: [line for line in text.splitlines() if OTHER_DOMAIN.search(line) or INSTALLS_OTHER.search(line)]
        for name, text in files.items()
        if OTHER_DOMAIN.search(text) or INSTALLS_OTHER.search(text)
    }


def test_no_doc_or_message_names_another_projects_domain_or_install_name():
    found = {name: lines for name, lines in offenders(shipped_text_files()).items()}
    assert not found, found


def test_the_patterns_catch_what_they_must():
    assert INSTALLS_OTHER.search("run: pip install statehouse")
    assert INSTALLS_OTHER.search("pip install -q 'statehouse==0.1.1'")
    assert not INSTALLS_OTHER.search("pip install statehouse-server")
    assert not INSTALLS_OTHER.search("pip install 'statehouse-client[checkpoint]' statehouse_client-0.1.0.whl")


def test_every_code_has_a_page_with_its_status_and_text():
    entries = pages()
    assert set(entries) == set(STATUS_BY_CODE) | {"internal_error", "http_error"}
    for code, status in STATUS_BY_CODE.items():
        assert entries[code].status == status, code
    source = (REPO / "app/problems.md").read_text()
    assert sum(line.startswith('| <a id="') for line in source.splitlines()) == len(entries)  # no row unread
    page = render_page(entries["unauthorized"])
    assert "HTTP 401 Unauthorized" in page and "<code>Authorization: Bearer &lt;token&gt;</code>" in page


def test_links_of_the_table_render_without_leaving_the_service():
    # a link into docs/ (not served) names the document; a link to another code goes to its page
    assert inline("its [scopes](../docs/api.md#auth) and `x<y>`") == (
        "its scopes (<cite>docs/api.md#auth</cite>) and <code>x&lt;y&gt;</code>"
    )
    assert inline("see [this](#key_not_owned)", "/sh") == 'see <a href="/sh/problems/key_not_owned">this</a>'
    assert "2<sup>63</sup>" in inline("2<sup>63</sup> <b>")
    assert "&lt;b&gt;" in inline("<b>")


def test_type_is_relative_to_the_answering_replica_and_its_root_path():
    assert problem_type("job_not_found") == "/problems/job_not_found"
    assert problem_type("job_not_found", root_path="/statehouse") == "/statehouse/problems/job_not_found"
    assert (
        problem_type("job_not_found", "https://docs.example/api.html") == "https://docs.example/api.html#job_not_found"
    )


def test_answers_point_at_pages_the_replica_serves(server):
    with httpx.Client(base_url=server.url, timeout=10) as http:
        answers = [
            http.get("/v1/jobs/no-such-job"),  # a handler's error
            http.put("/v1/jobs/x", content=b"{}"),  # the intake: no content type
            http.delete("/healthz"),  # the framework's 405
            http.get("/v1/jobs", headers={"x-big": "a" * 70_000}),  # the HTTP server itself
            http.get("/problems/no_such_code"),  # the pages' own 404
        ]
        expected = ["job_not_found", "unsupported_media_type", "method_not_allowed", "header_too_large", "not_found"]
        for answer, code in zip(answers, expected, strict=True):
            problem = answer.json()
            assert (problem["code"], problem["type"]) == (code, f"/problems/{code}"), answer.text
            page = http.get(problem["type"])
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert f"<h1><code>{code}</code></h1>" in page.text
            assert f"HTTP {answer.status_code} " in page.text
            assert page.headers["content-security-policy"].startswith("default-src 'self'")

        index = http.get("/problems")
        assert index.status_code == 200
        for code in pages():
            assert f'href="/problems/{code}"' in index.text
        for browser in ("/docs", "/redoc"):  # both API browsers link to the codes
            assert 'href="/problems"' in http.get(browser).text
        assert not OTHER_DOMAIN.search(http.get("/openapi.json").text)
