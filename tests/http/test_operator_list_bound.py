"""An operator list of one subtask is bounded where it is written, by STATEHOUSE_MAX_LIST_BYTES as a
keyed list of one key is: an append or a replace that would store more is refused 413
`list_too_large` naming the setting, changes nothing, and the list stays readable whole (an
unbounded list could grow past what one answer may hold, 413 `answer_too_large`, and never be
read again). Over real HTTP."""

from __future__ import annotations

import httpx
import pytest

from tests.support.server import start_server

pytestmark = [pytest.mark.http]

LIST = "/v1/jobs/j/operators/o/subtasks/0/lists/l"
ELEMENT = "x" * 1_000_000  # about 1 MB encoded: under STATEHOUSE_MAX_VALUE_BYTES


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("oplist"), {"STATEHOUSE_BACKEND": "rocksdb"})
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            client.put("/v1/jobs/j", json={"max_parallelism": 128}).raise_for_status()
            yield client
    finally:
        server.stop()
    assert "Traceback" not in server.log()


def refused(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text
    problem = response.json()
    assert problem["code"] == "list_too_large", problem
    assert "STATEHOUSE_MAX_LIST_BYTES" in problem["detail"], problem


def test_appends_stop_at_the_list_limit_and_the_list_stays_readable(http):
    accepted = 0
    for _ in range(80):  # 80 appends of 1 MB: past the 16 MB default
        answer = http.post(LIST, json={"value": ELEMENT})
        if answer.status_code != 204:
            refused(answer)
            break
        accepted += 1
    assert 10 <= accepted < 17, accepted  # 16 MiB by default
    refused(http.post(LIST, json={"values": [ELEMENT, ELEMENT]}))  # and anything after
    whole = http.get(LIST)
    assert whole.status_code == 200, whole.text[:500]
    assert whole.json()["value"] == [ELEMENT] * accepted  # the refused appends changed nothing
    # A replace is bounded alike; one that fits takes the list's place.
    refused(http.put(LIST, json={"value": [ELEMENT] * 17}))
    assert len(http.get(LIST).json()["value"]) == accepted
    assert http.put(LIST, json={"value": ["small"]}).status_code == 204
    assert http.get(LIST).json()["value"] == ["small"]
    assert http.post(LIST, json={"value": ELEMENT}).status_code == 204
