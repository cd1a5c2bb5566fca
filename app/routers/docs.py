"""The API browser (/docs: Swagger UI, /redoc: ReDoc) served without the internet, and the pages
of the problem codes (/problems, /problems/{code}: every problem's ``type``), linked from both.

FastAPI's own pages load their JavaScript, CSS and favicon from a CDN, so they stay blank in
clusters without egress. These serve the same pages with the assets of the pinned
``fastapi-offline`` package, read from its installed ``static`` directory (not copied into this
repository). Like ``/openapi.json`` they are never behind auth.
"""

from __future__ import annotations

import os
from typing import Any

import fastapi_offline
from fastapi import Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

from statehouse.app.problem_pages import PAGES, pages, render_index, render_page
from statehouse.app.problems import ApiError
from statehouse.app.routing import api_router

STATIC_URL = "/docs/static"
STATIC_DIR = os.path.join(os.path.dirname(fastapi_offline.__file__), "static")
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"

# Defaults under the app's own swagger_ui_parameters: keep the bearer token across reloads so the
# Authorize button is usable, and no validator badge (it would fetch from validator.swagger.io).
SWAGGER_UI_PARAMETERS: dict[str, Any] = {"persistAuthorization": True, "validatorUrl": None}

# The bundles still name a few outside addresses (ReDoc's sidebar logo is an image on
# cdn.redoc.ly): this policy keeps the browser from contacting any host but this one.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'"
)

router = api_router(include_in_schema=False)


def _self_only(response: HTMLResponse) -> HTMLResponse:
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response


def _with_problems_link(response: HTMLResponse, root: str) -> HTMLResponse:
    """The page with a first line linking to the problem codes' pages."""
    link = (
        f'<p style="font-family:sans-serif;margin:.5rem 1rem">Errors: <a href="{root}{PAGES}">'
        "every problem code, what it means and what to do</a></p>"
    )
    page = bytes(response.body).replace(b"<body>", b"<body>" + link.encode(), 1)
    return HTMLResponse(page, headers={k: v for k, v in response.headers.items() if k != "content-length"})


def static_files() -> StaticFiles:
    """The assets, to mount at ``STATIC_URL``; fails at startup if the package lacks them."""
    return StaticFiles(directory=STATIC_DIR, check_dir=True)


def _urls(request: Request) -> tuple[str, str, str]:
    """The OpenAPI document, the root path (a proxy's prefix) and the static assets behind it."""
    root = request.scope.get("root_path", "")
    return root + (request.app.openapi_url or "/openapi.json"), root, root + STATIC_URL


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    openapi_url, root, static = _urls(request)
    swagger = get_swagger_ui_html(
        openapi_url=openapi_url,
        title=f"{request.app.title} - Swagger UI",
        oauth2_redirect_url=root + OAUTH2_REDIRECT_URL,
        swagger_js_url=f"{static}/swagger-ui-bundle.js",
        swagger_css_url=f"{static}/swagger-ui.css",
        swagger_favicon_url=f"{static}/favicon.png",
        swagger_ui_parameters={**SWAGGER_UI_PARAMETERS, **(request.app.swagger_ui_parameters or {})},
    )
    return _self_only(_with_problems_link(swagger, root))


@router.get(OAUTH2_REDIRECT_URL)
async def swagger_ui_redirect() -> HTMLResponse:
    return _self_only(get_swagger_ui_oauth2_redirect_html())


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    openapi_url, root, static = _urls(request)
    redoc = get_redoc_html(
        openapi_url=openapi_url,
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{static}/redoc.standalone.js",
        redoc_favicon_url=f"{static}/favicon.png",
        with_google_fonts=False,
    )
    return _self_only(_with_problems_link(redoc, root))


@router.get(PAGES)
async def problem_codes(request: Request) -> HTMLResponse:
    return _self_only(HTMLResponse(render_index(request.scope.get("root_path", ""))))


@router.get(PAGES + "/{code}")
async def problem_code(request: Request, code: str) -> HTMLResponse:
    page = pages().get(code)
    if page is None:
        raise ApiError("not_found", f"no problem code {code!r}: {PAGES} lists every code")
    return _self_only(HTMLResponse(render_page(page, request.scope.get("root_path", ""))))
