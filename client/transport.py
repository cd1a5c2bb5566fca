"""Pooled HTTP connections per replica, with timeouts, retries and error mapping."""

from __future__ import annotations

import functools
import json
import ssl
import time
from typing import Any, NamedTuple, cast
from urllib.parse import urlencode

import msgpack
import urllib3
from urllib3.util.ssl_ import create_urllib3_context

from statehouse.client.errors import Unavailable, error_from_response
from statehouse.protocol import routes
from statehouse.protocol.routes import ARROW_STREAM, JSON, MSGPACK

_RETRY_STATUSES = frozenset({502, 503, 504})


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """A verifying TLS context with the system's CA certificates, built once per process:
    loading them costs 20-35 ms of CPU, and a Spark job opens a client per task and per
    micro-batch."""
    context = create_urllib3_context()
    context.load_default_certs()
    return context


class ReplicaConnection:
    """Requests to one replica through one urllib3 connection pool (the hot paths, batches and
    columnar requests, cost about half of what httpx costs per request: see bench/RESULTS.md).

    Retries are urllib3's :class:`~urllib3.util.Retry`: transport errors and 502-504, up to
    ``retries`` times with exponential backoff (``backoff`` is its ``backoff_factor``: the first
    retry at once, then 2x, 4x ``backoff`` seconds), and only for requests whose repetition
    cannot change the outcome (``idempotent``). urllib3 does not obey ``Retry-After`` here: it
    would wait up to six hours for one, and retry 413 and 429 answers that carry it.

    A 503 ``rescale_in_progress`` (a write to a key group a live rescale is moving) is retried
    here instead, for every request, idempotent or not (the refusal applied nothing): after the
    answer's ``retry_after_ms`` (for the first 5 s of refusals; then ``Retry-After``), or the
    backoff if longer, at that steady pace (a writer stalls at most one interval past the move's
    commit, not a growing backoff), for at most ``rescale_wait`` seconds in all. Once the move
    commits, the retry is answered 421 naming the new version, which the callers route again
    (``Replicas.refreshed``)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.1,
        rescale_wait: float = 120.0,
    ) -> None:
        self.url = url.rstrip("/")
        self._backoff = backoff
        self._rescale_wait = rescale_wait
        tls = {"ssl_context": _tls_context()} if self.url.startswith("https:") else {}
        self._pool = urllib3.connection_from_url(
            self.url, maxsize=8, block=False, timeout=urllib3.Timeout(total=timeout), retries=False, **tls
        )
        self._retry = _Retry(
            total=retries,
            backoff_factor=backoff,
            status_forcelist=_RETRY_STATUSES,
            allowed_methods=None,  # every method: only idempotent requests are given this policy
            redirect=False,
            respect_retry_after_header=False,
            raise_on_status=False,  # the last answer is returned, its problem+json mapped below
        )
        auth = {"authorization": f"Bearer {token}"} if token else {}
        self._headers = {**auth, "accept": JSON}
        self._json_headers = {**auth, "accept": JSON, "content-type": JSON}
        self._batch_headers = {**auth, "content-type": MSGPACK, "accept": MSGPACK}
        self._columns_headers = {**auth, "content-type": ARROW_STREAM, "accept": f"{ARROW_STREAM}, {JSON}"}

    def _send(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], *, idempotent: bool
    ) -> _Answer:
        """One request, retried per :class:`ReplicaConnection`'s policy; errors as exceptions."""
        refused: float | None = None  # when the first 503 rescale_in_progress came
        while True:
            try:
                response = self._pool.urlopen(
                    method,
                    path,
                    body=body,
                    headers=headers,
                    retries=self._retry if idempotent else False,
                    redirect=False,
                )
            except urllib3.exceptions.HTTPError as exc:
                raise Unavailable(f"{self.url} unreachable: {no_answer(exc)}") from exc
            if response.status < 400:
                return _Answer(response.status, response.data, response.reason or "")
            error = error_from_response(response.status, response.data, response.reason or "")
            if response.status != 503 or error.code != "rescale_in_progress":
                raise error
            now = time.monotonic()
            refused = refused if refused is not None else now
            retry_after = response.headers.get("retry-after")
            # The finer pace while a freeze is as short as one should be; past that (a coordinator
            # that died mid-move, say) the header's, so that waiting writers do not flood the replica.
            fine = now - refused < _FINE_PACE_FOR
            delay = max(_retry_delay(error.problem if fine else None, retry_after), self._backoff)
            if now + delay > refused + self._rescale_wait:
                raise type(error)(
                    f"{error.detail} (still refused after {self._rescale_wait:.0f}s of retries: finish or abort the "
                    f"rescale with statehouse rescale --resume|--abort)",
                    status=error.status,
                    code=error.code,
                    problem=error.problem,
                )
            time.sleep(delay)

    def request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool,
        json: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> _Answer:
        """A control-plane request: a JSON body (``json``) or raw ``content``, query ``params``."""
        if params:
            path = f"{path}?{urlencode(params, doseq=True)}"
        if json is not None:
            content, base = _dumps(json), self._json_headers
        else:
            base = self._headers
        return self._send(method, path, content, {**base, **(headers or {})}, idempotent=idempotent)

    def json(self, method: str, path: str, body: Any = None, *, idempotent: bool = True) -> Any:
        answer = self.request(method, path, idempotent=idempotent, json=body)
        return json.loads(answer.content) if answer.content else None

    def batch(self, job: str, ops: list[dict[str, Any]], *, fields: dict[str, Any], idempotent: bool) -> list[Any]:
        """``fields``: the fencing epoch, or a task attempt's epoch, partition, attempt and seq."""
        body: dict[str, Any] = {"ops": ops, **fields}
        payload = msgpack.packb(body, use_bin_type=True)
        answer = self._send(
            "POST", routes.path(routes.BATCH, job=job), payload, self._batch_headers, idempotent=idempotent
        )
        return msgpack.unpackb(answer.content, raw=False, strict_map_key=False)["results"]

    def columns(
        self,
        job: str,
        state: str | tuple[str, ...],
        op: str,
        body: bytes | memoryview,
        *,
        params: dict[str, Any],
        idempotent: bool,
    ) -> bytes:
        """One columnar request (an Arrow IPC stream, ``client/columns.py`` builds it); the answer's
        body: an Arrow stream for reads, a JSON summary for writes. ``params``: the fencing epoch,
        or a task attempt's epoch, partition, attempt and seq, sent as query parameters. ``state``
        a tuple: the operation on those states over the same rows (one value column per state)."""
        if isinstance(state, tuple):
            query = urlencode({"states": ",".join(state), **params})
            path = f"{routes.path(routes.JOB_COLUMNS, job=job, op=op)}?{query}"
        else:
            query = urlencode(params)
            path = routes.path(routes.STATE_COLUMNS, job=job, state=state, op=op) + (f"?{query}" if query else "")
        # urllib3 sends any buffer as it is (its annotation names bytes): no copy of the Arrow stream.
        return self._send("POST", path, cast(bytes, body), self._columns_headers, idempotent=idempotent).content

    def close(self) -> None:
        self._pool.close()


class _Retry(urllib3.Retry):
    """urllib3's policy, except for a 503 carrying ``Retry-After`` (``rescale_in_progress``):
    :meth:`ReplicaConnection._send` retries those itself, as the header says."""

    def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
        if status_code == 503 and has_retry_after:
            return False
        return super().is_retry(method, status_code, has_retry_after)


_FINE_PACE_FOR = 5.0  # seconds of refusals retried at the problem's retry_after_ms


def _retry_delay(problem: dict[str, Any] | None, retry_after: str | None) -> float:
    """The pace the server asks for: the problem's ``retry_after_ms`` (finer than the header), else
    the ``Retry-After`` header."""
    ms = (problem or {}).get("retry_after_ms")
    if isinstance(ms, int) and not isinstance(ms, bool) and 0 <= ms <= 60_000:
        return ms / 1000
    return _retry_after(retry_after)


def _retry_after(value: str | None) -> float:
    """A ``Retry-After`` of seconds (the only form the server sends); 0 when absent or another form."""
    try:
        return max(0.0, float(value)) if value else 0.0
    except ValueError:
        return 0.0


class _Answer(NamedTuple):
    status: int
    content: bytes
    reason: str


def _dumps(value: Any) -> bytes:
    """JSON as the server reads it: no NaN or Infinity (a ValueError here, not a 400 there)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


# urllib3's errors of a replica that did not answer, by kind, in a few words.
_NO_ANSWER: tuple[tuple[type[Exception], str], ...] = (
    (urllib3.exceptions.NameResolutionError, "its host name does not resolve"),
    (urllib3.exceptions.ConnectTimeoutError, "the connection timed out"),
    (urllib3.exceptions.ReadTimeoutError, "no answer in time"),
    (urllib3.exceptions.ProtocolError, "the connection broke"),
)


def no_answer(exc: urllib3.exceptions.HTTPError) -> str:
    """Why a replica did not answer, in a few words (``connection refused``, ``its host name does
    not resolve``): the cause urllib3 wraps, not its ~300-character ``MaxRetryError(...)``."""
    cause: BaseException = exc
    while isinstance(cause, urllib3.exceptions.MaxRetryError) and cause.reason is not None:
        cause = cause.reason
    if isinstance(cause.__context__, ConnectionRefusedError):  # urllib3's NewConnectionError wraps it
        return "connection refused"
    for kind, words in _NO_ANSWER:
        if isinstance(cause, kind):
            return words
    text = str(cause).rsplit(": ", 1)[-1].strip()
    return text[:1].lower() + text[1:] if text else type(cause).__name__
