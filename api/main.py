"""The FastAPI application: ``create_app(settings)``. Thin: it validates, calls ``tuner/``, serialises."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from api import dashboard, docs, streams
from api.routes import analysis, configs, meta, notes, studies
from api.settings import Settings
from tuner.store.storage import StudyDB, is_transient
from tuner.study.spec import semantic_errors

log = logging.getLogger("api")
#: Seconds a client is told to wait (``Retry-After``) when the database cannot be reached.
RETRY_AFTER_S = 2


class BodySizeLimit:
    """Refuse request bodies over ``max_bytes`` with 413, before anything parses them: by Content-Length
    when given, else (a chunked body) by reading it here, up to the limit, and handing the app what was read.

    The chunked case cannot be refused from inside the app's ``receive``: FastAPI turns any error while it
    reads a body into a 400.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.max_bytes:
                await self._reject(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            received += len(chunks[-1])
            if received > self.max_bytes:
                await self._reject(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    async def _reject(self, scope: dict, receive: Any, send: Any) -> None:
        response = JSONResponse({"detail": f"request body larger than {self.max_bytes} bytes"}, status_code=413)
        await response(scope, receive, send)


#: Headers on every response; one that sets its own (a page's Content-Security-Policy) keeps it. The default
#: policy is for what is no page (JSON, text, scripts, images): nothing in it may load or run anything.
SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"content-security-policy", b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'"),
)


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every HTTP response, errors and refusals of the other middleware too."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                present = {name.lower() for name, _ in headers}
                message["headers"] = headers + [(k, v) for k, v in SECURITY_HEADERS if k not in present]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _replay(messages: list[dict], receive: Any) -> Any:
    """A ``receive`` that answers ``messages`` first, then defers to ``receive`` (for the disconnect)."""
    pending = list(messages)

    async def replayed() -> dict:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def _json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities as their names: a validation error quotes its input, which may be one."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422, with every error JSON-serialisable (its default handler answers 500 for a NaN input).
    A submitted spec's answer also lists what its valid fields break against the registry (workload args,
    metrics, constraints, space), so one answer names every error of the spec."""
    detail = jsonable_encoder(exc.errors())
    if request.method == "POST" and request.url.path.rstrip("/").endswith("/api/studies"):
        bad = {str(e["loc"][1]) for e in exc.errors() if len(e.get("loc", ())) > 1 and e["loc"][0] == "body"}
        if isinstance(exc.body, dict) and bad:
            more = await asyncio.to_thread(semantic_errors, exc.body, bad)
            detail += [
                {"loc": ["body", *[p for p in f.split(".") if p]], "msg": m, "type": "value_error"} for f, m in more
            ]
    return JSONResponse({"detail": _json_safe(detail)}, status_code=422)


async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """A database blip (a restart, a dropped connection) is 503 with ``Retry-After``, not a 500."""
    if not is_transient(exc):
        log.error("database error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"detail": "internal server error"}, status_code=500)
    log.warning("database unreachable on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return JSONResponse(
        {"detail": "the study database cannot be reached; retry shortly"},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    app = FastAPI(
        title="gpu-knob-tuner",
        version="0.1.0",
        description="Submit tuning studies, watch their Pareto fronts, export the winners.",
        # Served by api/docs.py from an installed package: FastAPI's own pages load their assets from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.state.db = StudyDB(settings.db_url)
    app.state.db.create_tables()
    app.state.runner = None  # `tuner serve` puts its supervised runner here (served_app), for /healthz
    app.add_exception_handler(DBAPIError, database_unavailable)
    app.add_exception_handler(PoolTimeout, database_unavailable)
    app.include_router(studies.router)
    app.include_router(streams.router)
    app.include_router(analysis.router)
    app.include_router(notes.router)
    app.include_router(meta.router)
    app.include_router(configs.router)
    app.include_router(dashboard.router)
    app.include_router(docs.router)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key"],
        )
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(SecurityHeaders)  # the outermost: on the 413s above and on every error too
    return app


def served_app() -> FastAPI:
    """The app ``tuner serve`` serves (uvicorn calls this factory by its import string): settings from the
    environment with the command's host and database, refused as :meth:`Settings.check` says, and the
    runner it supervises for ``/healthz``."""
    from tuner.run.supervisor import served

    handed = served()
    settings = Settings.from_env(host=handed.host, db_url=handed.db_url)
    settings.check()
    app = create_app(settings)
    app.state.runner = handed.runner
    return app
