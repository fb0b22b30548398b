"""The browser dashboard: server-rendered page shells whose JavaScript reads the JSON API.

``router`` serves ``GET /`` (studies), ``GET /studies/{study_id}`` (one study) and
``GET /static/{name}`` (``api/static/*``, with the pages' ES modules in ``api/static/js/``, plus
``plotly.min.js`` from the installed ``plotly`` package: no CDN, the dashboard works without a network).
The study page draws its first view with Plotly's basic bundle (``api/static/plotly-basic.min.js``: scatter
and bar traces, a quarter of the full bundle, which a browser takes seconds to compile); its script loads
the full bundle only for a plot that needs another trace type (parallel coordinates, WebGL scatter, 3-D).

The pages read nothing from the database: their script polls ``/api/...`` (server-sent
events with a polling fallback on the study page), so they stay live while a study runs.
The study page asks the app's own ``GET /api/studies/{id}`` in-process, only to answer a
missing study with a 404 page and to put the study's name in the title.

Templates are Jinja2 with autoescape on; scripts insert user strings with ``textContent``
(or escape them for Plotly's hover text, which renders a subset of HTML). This module
imports neither torch, triton, ray nor optuna.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import logging
from pathlib import Path
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
TEMPLATE_DIR = HERE / "templates"
STATIC_DIR = HERE / "static"
PLOTLY_JS = "plotly.min.js"
#: Plotly's basic bundle (the npm package ``plotly.js-basic-dist-min``, kept in api/static with its licence).
PLOTLY_BASIC_JS = "plotly-basic.min.js"
#: Static files whose content changes only with a release or the installed plotly package.
_PLOTLY_FILES = (PLOTLY_JS, PLOTLY_BASIC_JS)
_MEDIA_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
}

# Scripts only from this origin, none inline. 'unsafe-eval': Plotly's parcoords draws through regl,
# which compiles its draw calls with new Function (without it: "WebGL is not supported"). Plotly
# injects its own <style> elements, hence inline styles.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; worker-src 'self' blob:; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

router = APIRouter(include_in_schema=False)

_env = Environment(
    loader=FileSystemLoader(TEMPLATE_DIR),
    autoescape=True,  # every page is HTML: escape every value, not only those of *.html names
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def plotly_js_path() -> Path | None:
    """``plotly/package_data/plotly.min.js`` of the installed ``plotly`` package (not imported)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "package_data" / PLOTLY_JS
        if path.is_file():
            return path
    return None


def _static_file(name: str) -> Path | None:
    """A file in ``api/static`` or one of its folders (``js/``: the pages' modules), no dot file or folder,
    or plotly.min.js."""
    if name == PLOTLY_JS:
        return plotly_js_path()
    parts = name.split("/")
    if not name or "\\" in name or any(not part or part.startswith(".") for part in parts):
        return None
    path = STATIC_DIR.joinpath(*parts)
    if not path.is_file() or STATIC_DIR not in path.resolve().parents:
        return None
    return path


def _asset_version() -> str:
    """Changes whenever a static file does, so browsers never run a stale script against a new page."""
    stamps = [int(p.stat().st_mtime) for p in STATIC_DIR.rglob("*") if p.is_file()]
    return format(max(stamps, default=0), "x")


def _render(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    root = request.scope.get("root_path", "").rstrip("/")
    html = _env.get_template(template).render(root=root, asset_version=_asset_version(), **context)
    return HTMLResponse(html, status_code=status_code, headers=_PAGE_HEADERS)


def not_found_page(request: Request, message: str) -> HTMLResponse:
    return _render(request, "not_found.html", status_code=404, message=message)


async def _lookup_study(request: Request, study_id: int) -> tuple[int, dict[str, Any] | None]:
    """Ask this app's own JSON API for the study, in-process: (HTTP status, body or None)."""
    # Straight into the app, past any proxy prefix: its routes match "/api/..." as they are.
    transport = httpx.ASGITransport(app=request.app, raise_app_exceptions=False)
    base_url = f"{request.url.scheme}://{request.url.netloc or 'localhost'}"  # the same Host, for host checks
    headers: dict[str, str | bytes] = {"accept": "application/json"}
    if "authorization" in request.headers:  # reads may need the caller's token; never more than the caller has
        headers["authorization"] = request.headers["authorization"].encode("latin-1")  # the bytes as they came
    try:
        async with httpx.AsyncClient(transport=transport, base_url=base_url, timeout=10) as client:
            response = await client.get(f"/api/studies/{study_id}", headers=headers)
    except Exception:  # the page still works: its script reports what the API says
        log.exception("dashboard: GET /api/studies/%s failed in-process", study_id)
        return 0, None
    if response.status_code != 200:
        return response.status_code, None
    try:
        body = response.json()
    except ValueError:
        return response.status_code, None
    return 200, body if isinstance(body, dict) else None


@router.get("/", response_class=HTMLResponse, name="dashboard_index")
async def index_page(request: Request) -> HTMLResponse:
    """All studies: status, progress, best value of the first objective; refreshed live."""
    return _render(request, "index.html")


@router.get("/studies/{study_id}", response_class=HTMLResponse, name="dashboard_study")
async def study_page(request: Request, study_id: str) -> HTMLResponse:
    """One study: Pareto front, history, parameters, importances, trials; live while it runs."""
    if not study_id.isascii() or not study_id.isdigit() or len(study_id) > 18:
        return not_found_page(request, "Study ids are whole numbers.")
    number = int(study_id)
    status, study = await _lookup_study(request, number)
    if status == 404:
        return not_found_page(request, f"There is no study {number}.")
    settings = getattr(request.app.state, "settings", None)  # None: an app without the API's settings
    return _render(
        request,
        "study.html",
        plotly_js=PLOTLY_BASIC_JS if (STATIC_DIR / PLOTLY_BASIC_JS).is_file() else PLOTLY_JS,
        study_id=number,
        study_name=(study or {}).get("name") or f"study {number}",
        study_status=(study or {}).get("status") or "",
        workload=(study or {}).get("workload") or "",
        provenance_note=_provenance_note(study),
        study_error=(study or {}).get("error") or "",
        writes_need_token=bool(settings is not None and settings.token),
    )


@router.get("/compare", response_class=HTMLResponse, name="dashboard_compare")
async def compare_page(request: Request, studies: str = "") -> HTMLResponse:
    """Several studies overlaid (best so far, EDF, fronts) and their picks side by side; ``?studies=1,2``."""
    ids = [part for part in studies.split(",") if part.strip()]
    if not ids or len(ids) > 8 or not all(p.strip().isascii() and p.strip().isdigit() and len(p) <= 18 for p in ids):
        return not_found_page(request, "Compare takes ?studies= two to eight study ids, comma-separated.")
    return _render(
        request,
        "compare.html",
        plotly_js=PLOTLY_JS,
        study_ids=",".join(str(int(p)) for p in ids),
    )


@router.get("/registry", response_class=HTMLResponse, name="dashboard_registry")
async def registry_page(request: Request) -> HTMLResponse:
    """The best-config registry: entries by workload, GPU and shape; regressed and unverified ones stand out."""
    return _render(request, "registry.html")


def _provenance_note(study: dict[str, Any] | None) -> str:
    """Where the study's measurements come from when not from its own workers (a replayed landscape), or ""."""
    if not study or study.get("workload") != "replay":  # the one workload whose trials are not run here
        return ""
    from tuner.workloads.registry import workload_class

    try:
        provenance = workload_class("replay")(**((study.get("spec") or {}).get("args") or {})).provenance()
    except Exception:  # a landscape gone since: say what the spec says
        return "Replayed measurements from a recorded landscape: this study ran and timed nothing."
    return f"{provenance['note'][0].upper()}{provenance['note'][1:]} (landscape {provenance['file']})."


@router.get("/static/{name:path}", name="dashboard_static")
async def static_file(request: Request, name: str) -> Response:
    """A static file from memory, gzipped where the browser takes it: plotly.min.js is 4.8 MB, 1.4 MB
    gzipped, and one write of it costs a loaded server far less than a file streamed in chunks.

    Caching: a file asked for with the current ``?v=`` (what the pages link) is immutable for a year, the
    Plotly bundles for a day; anything else is revalidated, by its ``ETag`` (304 when unchanged)."""
    path = _static_file(name)
    if path is None:
        return not_found_page(request, "No such file.")
    stat = path.stat()
    plain, packed = _static_body(str(path), stat.st_mtime_ns, stat.st_size)
    etag = f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'
    if request.query_params.get("v") == _asset_version():
        cache = "public, max-age=31536000, immutable"
    elif name in _PLOTLY_FILES:
        cache = "public, max-age=86400"
    else:
        cache = "no-cache"
    headers = {"Cache-Control": cache, "ETag": etag, "X-Content-Type-Options": "nosniff", "Vary": "Accept-Encoding"}
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    body = plain
    if "gzip" in request.headers.get("accept-encoding", "").lower():
        body, headers["Content-Encoding"] = packed, "gzip"
    return Response(body, media_type=_MEDIA_TYPES.get(path.suffix, "application/octet-stream"), headers=headers)


@functools.lru_cache(maxsize=16)
def _static_body(path: str, mtime_ns: int, size: int) -> tuple[bytes, bytes]:
    """A static file's bytes and their gzip, read and compressed once per version of the file (the
    modification time and size are the cache key)."""
    data = Path(path).read_bytes()
    return data, gzip.compress(data, compresslevel=6, mtime=0)
