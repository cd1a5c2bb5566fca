"""The problem+json answer a test expects."""

from __future__ import annotations

from typing import Any

import httpx


def problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """Assert ``response`` is a problem+json of this status and code with a detail; its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json", response.headers
    body = response.json()
    assert body["code"] == code and body["detail"], body
    return body
