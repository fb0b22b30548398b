"""Typed dependencies: the database, the settings, and the bearer-token checks."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.settings import Settings
from tuner.store.storage import StudyDB, StudyRow


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_db(request: Request) -> StudyDB:
    return request.app.state.db


SettingsDep = Annotated[Settings, Depends(get_settings)]
DBDep = Annotated[StudyDB, Depends(get_db)]


#: The schema's ``bearer`` security scheme, on every route that may need the token: the API docs' Authorize
#: button sends it. ``auto_error`` off: whether a token is needed is the server's setting, checked below.
bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="The server's $TUNER_API_TOKEN. Writes need it when the server has a token; reads beyond loopback "
    "need it too unless TUNER_PUBLIC_READS=1.",
)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def _token_ok(request: Request, settings: Settings) -> bool:
    """Whether the request carries the server's token (or the server has none). The header is compared as the
    bytes that came (headers arrive as latin-1 text) with the token's UTF-8 bytes, so a header of any bytes,
    empty or without a scheme, is simply not the token."""
    if not settings.token:
        return True
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        value.strip().encode("latin-1"), settings.token.encode("utf-8")
    )


def require_write(request: Request, settings: SettingsDep, _credentials: BearerDep) -> None:
    if not _token_ok(request, settings):
        raise HTTPException(
            401,
            "a bearer token is required (Authorization: Bearer $TUNER_API_TOKEN)",
            headers={"WWW-Authenticate": "Bearer"},
        )


def require_read(request: Request, settings: SettingsDep, _credentials: BearerDep) -> None:
    if settings.reads_need_token and not _token_ok(request, settings):
        raise HTTPException(
            401, "a bearer token is required to read from this server", headers={"WWW-Authenticate": "Bearer"}
        )


MAX_ID = 2**31 - 1  # ids and trial numbers are 32-bit integers in the database


def study_or_404(study_id: Annotated[int, Path(ge=1, le=MAX_ID)], db: DBDep) -> StudyRow:
    row = db.get_study(study_id)
    if row is None or row.status == "deleted":  # being deleted (tuner/store/lifecycle.py): gone for readers
        raise HTTPException(404, f"no study {study_id}")
    return row


StudyDep = Annotated[StudyRow, Depends(study_or_404)]
