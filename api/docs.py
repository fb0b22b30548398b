"""The API's interactive docs, served offline: Swagger UI at ``/docs`` and ReDoc at ``/redoc``, their scripts and
styles from the installed ``fastapi-offline`` package (``GET /docs-assets/{name}``), never from a CDN.

The pages load nothing from another origin: Swagger UI's online validator is off, ReDoc gets no web fonts, and
a Content-Security-Policy keeps every request on this origin (ReDoc's bundle shows its vendor's logo from a CDN:
the policy blocks it, and ReDoc drops an image that fails to load).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse, Response

#: The package whose ``static/`` folder holds the Swagger UI and ReDoc bundles.
ASSET_PACKAGE = "fastapi_offline"
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}

router = APIRouter(include_in_schema=False)

# Inline script: FastAPI's pages start Swagger UI from one. blob: ReDoc's search runs in a worker made from a blob.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; worker-src 'self' blob:; font-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


def _page(response: HTMLResponse) -> HTMLResponse:
    response.headers["Content-Security-Policy"] = DOCS_CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def assets_dir() -> Path | None:
    """``static/`` of the installed asset package (found, not imported), or None when it is not installed."""
    spec = importlib.util.find_spec(ASSET_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(location) / "static"
        if (path / "swagger-ui-bundle.js").is_file():
            return path
    return None


def _root(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/")


def _missing() -> Response:
    return PlainTextResponse(
        f"the API docs need the {ASSET_PACKAGE.replace('_', '-')} package (a dependency of this project): "
        "reinstall with scripts/setup.sh; the schema is at /openapi.json",
        status_code=503,
    )


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui(request: Request) -> Response:
    if assets_dir() is None:
        return _missing()
    root = _root(request)
    return _page(
        get_swagger_ui_html(
            openapi_url=f"{root}{request.app.openapi_url}",
            title=f"{request.app.title} - API docs",
            swagger_js_url=f"{root}/docs-assets/swagger-ui-bundle.js",
            swagger_css_url=f"{root}/docs-assets/swagger-ui.css",
            swagger_favicon_url=f"{root}/docs-assets/favicon.png",
            oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
            # null: no badge fetched from the online validator
            swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": True},
        )
    )


@router.get("/docs/oauth2-redirect", response_class=HTMLResponse)
def swagger_ui_redirect() -> HTMLResponse:
    return _page(get_swagger_ui_oauth2_redirect_html())


@router.get("/redoc", response_class=HTMLResponse)
def redoc(request: Request) -> Response:
    if assets_dir() is None:
        return _missing()
    root = _root(request)
    return _page(
        get_redoc_html(
            openapi_url=f"{root}{request.app.openapi_url}",
            title=f"{request.app.title} - API reference",
            redoc_js_url=f"{root}/docs-assets/redoc.standalone.js",
            redoc_favicon_url=f"{root}/docs-assets/favicon.png",
            with_google_fonts=False,
        )
    )


@router.get("/docs-assets/{name}")
def docs_asset(name: str) -> Response:
    folder = assets_dir()
    if folder is None or name not in ASSETS:
        return PlainTextResponse("no such file", status_code=404)
    return FileResponse(
        folder / name,
        media_type=ASSETS[name],
        headers={"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"},
    )
