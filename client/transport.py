"""One pooled HTTP connection per replica, with timeouts, retries and error mapping."""

from __future__ import annotations

import time
from typing import Any

import httpx
import msgpack

from client.errors import Unavailable, error_from_response

MSGPACK = "application/msgpack"
_RETRY_STATUSES = frozenset({502, 503, 504})


class ReplicaConnection:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.1,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=8, max_keepalive_connections=8),
        )
        self.retries = retries
        self.backoff = backoff

    def request(self, method: str, path: str, *, idempotent: bool, **kwargs: Any) -> httpx.Response:
        """Send a request; retry transport errors and 502-504 with exponential backoff, but only
        when repeating the request cannot change the outcome (``idempotent``)."""
        attempts = self.retries + 1 if idempotent else 1
        for attempt in range(attempts):
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if attempt + 1 == attempts:
                    raise Unavailable(f"{self.url} unreachable: {exc!r}") from exc
            else:
                if response.status_code < 400:
                    return response
                if response.status_code not in _RETRY_STATUSES or attempt + 1 == attempts:
                    raise error_from_response(response)
            time.sleep(self.backoff * (2**attempt))
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, body: Any = None, *, idempotent: bool = True) -> Any:
        response = self.request(method, path, idempotent=idempotent, json=body)
        return response.json() if response.content else None

    def batch(self, job: str, ops: list[dict[str, Any]], *, epoch: int | None, idempotent: bool) -> list[Any]:
        body: dict[str, Any] = {"ops": ops}
        if epoch is not None:
            body["epoch"] = epoch
        response = self.request(
            "POST",
            f"/v1/jobs/{job}/batch",
            idempotent=idempotent,
            content=msgpack.packb(body, use_bin_type=True),
            headers={"content-type": MSGPACK, "accept": MSGPACK},
        )
        return msgpack.unpackb(response.content, raw=False, strict_map_key=False)["results"]

    def close(self) -> None:
        self._http.close()
