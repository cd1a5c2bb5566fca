"""Refuse request bodies above ``STATEHOUSE_MAX_BODY_BYTES`` before reading them whole.

Not FastAPI's ``max_body_size`` (Starlette's ``RequestBodyLimitMiddleware``): when a request's
Content-Length is over the limit, it replaces whatever the app answers, problem+json included,
with a ``text/plain`` "Content Too Large" (checked with FastAPI 0.165 / Starlette 1.10), and
every error here is problem+json with a code and what to do.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from statehouse.app.problems import ApiError, problem_response


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.detail = f"request body exceeds {max_bytes} bytes (STATEHOUSE_MAX_BODY_BYTES); send smaller batches"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await problem_response(413, "body_too_large", self.detail, scope.get("path"))(scope, receive, send)
                return
        received = 0

        async def counting_receive() -> Message:
            # Without a Content-Length (chunked upload), count while reading.
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise ApiError("body_too_large", self.detail)
            return message

        await self.app(scope, counting_receive, send)
