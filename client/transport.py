"""Pooled HTTP connections per replica, with timeouts, retries and error mapping."""

from __future__ import annotations

import functools
import json
import ssl
import time
from collections.abc import Callable
from typing import Any, NamedTuple, cast
from urllib.parse import urlencode

import httpx
import msgpack
import urllib3

from statehouse.client.errors import Unavailable, error_from_response

MSGPACK = "application/msgpack"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
_RETRY_STATUSES = frozenset({502, 503, 504})


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default verifying TLS context, built once per process: building it reads the CA
    bundle (20-35 ms of CPU), and a Spark job opens a client per task and per micro-batch."""
    return httpx.create_ssl_context()


class ReplicaConnection:
    """Requests to one replica: JSON calls through httpx, and the hot paths (batches, columnar
    requests) through a urllib3 pool, which costs about half of httpx per request (see
    bench/RESULTS.md)."""

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
            verify=_tls_context(),
            limits=httpx.Limits(max_connections=8, max_keepalive_connections=8),
        )
        self._pool = urllib3.connection_from_url(
            self.url, maxsize=8, block=False, timeout=urllib3.Timeout(total=timeout), retries=False
        )
        self._batch_headers = {**headers, "content-type": MSGPACK, "accept": MSGPACK}
        self._columns_headers = {**headers, "content-type": ARROW_STREAM, "accept": f"{ARROW_STREAM}, application/json"}
        self.retries = retries
        self.backoff = backoff

    def _retrying(self, send: Callable[[], _Answer], idempotent: bool) -> _Answer:
        """Retry transport errors and 502-504 with exponential backoff, but only when repeating
        the request cannot change the outcome (``idempotent``); map errors to exceptions."""
        attempts = self.retries + 1 if idempotent else 1
        for attempt in range(attempts):
            try:
                answer = send()
            except (httpx.TransportError, urllib3.exceptions.HTTPError) as exc:
                if attempt + 1 == attempts:
                    raise Unavailable(f"{self.url} unreachable: {exc!r}") from exc
            else:
                if answer.status < 400:
                    return answer
                if answer.status not in _RETRY_STATUSES or attempt + 1 == attempts:
                    raise error_from_response(answer.status, answer.content, answer.reason)
            time.sleep(self.backoff * (2**attempt))
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, *, idempotent: bool, **kwargs: Any) -> _Answer:
        def send() -> _Answer:
            response = self._http.request(method, path, **kwargs)
            return _Answer(response.status_code, response.content, response.reason_phrase)

        return self._retrying(send, idempotent)

    def json(self, method: str, path: str, body: Any = None, *, idempotent: bool = True) -> Any:
        answer = self.request(method, path, idempotent=idempotent, json=body)
        return json.loads(answer.content) if answer.content else None

    def batch(self, job: str, ops: list[dict[str, Any]], *, fields: dict[str, Any], idempotent: bool) -> list[Any]:
        """``fields``: the fencing epoch, or a task attempt's epoch, partition, attempt and seq."""
        body: dict[str, Any] = {"ops": ops, **fields}
        payload = msgpack.packb(body, use_bin_type=True)
        path = f"/v1/jobs/{job}/batch"

        def send() -> _Answer:
            response = self._pool.urlopen("POST", path, body=payload, headers=self._batch_headers, retries=False)
            return _Answer(response.status, response.data, response.reason or "")

        answer = self._retrying(send, idempotent)
        return msgpack.unpackb(answer.content, raw=False, strict_map_key=False)["results"]

    def columns(
        self,
        job: str,
        state: str,
        op: str,
        body: bytes | memoryview,
        *,
        params: dict[str, Any],
        idempotent: bool,
    ) -> bytes:
        """One columnar request (an Arrow IPC stream, ``client/columns.py`` builds it); the answer's
        body: an Arrow stream for reads, a JSON summary for writes. ``params``: the fencing epoch,
        or a task attempt's epoch, partition, attempt and seq, sent as query parameters."""
        query = urlencode(params)
        path = f"/v1/jobs/{job}/states/{state}/columns/{op}" + (f"?{query}" if query else "")

        def send() -> _Answer:
            # urllib3 sends any buffer as it is (its annotation names bytes): no copy of the Arrow stream.
            payload = cast(bytes, body)
            response = self._pool.urlopen("POST", path, body=payload, headers=self._columns_headers, retries=False)
            return _Answer(response.status, response.data, response.reason or "")

        return self._retrying(send, idempotent).content

    def close(self) -> None:
        self._http.close()
        self._pool.close()


class _Answer(NamedTuple):
    status: int
    content: bytes
    reason: str
