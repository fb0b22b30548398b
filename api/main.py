"""The FastAPI application: ``create_app(settings)``. Thin: it validates, calls ``tuner/``, serialises."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse

from api import dashboard
from api.routes import meta, studies
from api.settings import Settings
from tuner.storage import StudyDB


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    """Refuse request bodies over ``max_bytes`` with 413, before anything parses them
    (by Content-Length when given, else while the body streams in)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._reject(scope, receive, send)
            return
        received = 0

        async def limited() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._reject(scope, receive, send)

    async def _reject(self, scope: dict, receive: Any, send: Any) -> None:
        response = JSONResponse({"detail": f"request body larger than {self.max_bytes} bytes"}, status_code=413)
        await response(scope, receive, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    app = FastAPI(
        title="gpu-knob-tuner",
        version="0.1.0",
        description="Submit tuning studies, watch their Pareto fronts, export the winners.",
    )
    app.state.settings = settings
    app.state.db = StudyDB(settings.db_url)
    app.state.db.create_tables()
    app.include_router(studies.router)
    app.include_router(meta.router)
    app.include_router(dashboard.router)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key"],
        )
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    return app
