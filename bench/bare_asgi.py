"""The floor under every request: a bare ASGI app on the server's own stack.

``python -m bench.bare_asgi --port N`` runs :data:`app` exactly as ``python -m statehouse.app.serve``
runs Statehouse (``statehouse.app.serve.config``: uvicorn, httptools with the HTTP limits, uvloop,
the same keep-alive and logging), with uvicorn's access log off. The app reads the whole body and
answers a small JSON body with a Content-Length, in the two ASGI messages every app sends: what
no application can do for less on this server (bench/http_server.py ``--floor``).
"""

from __future__ import annotations

import argparse

import uvicorn
from starlette.types import Receive, Scope, Send

from statehouse.app.serve import config
from statehouse.app.settings import load_settings

ANSWER = b'{"op":"put","rows":1,"staged":false}'
HEAD = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())],
}


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":  # lifespan: nothing to start
        message = await receive()
        while message["type"] != "lifespan.shutdown":
            await send({"type": message["type"] + ".complete"})
            message = await receive()
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send(HEAD)
    await send({"type": "http.response.body", "body": ANSWER})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server_config = config(load_settings(), "127.0.0.1", args.port, app="bench.bare_asgi:app", access_log=False)
    uvicorn.Server(server_config).run()


if __name__ == "__main__":
    main()
