"""Connections to the study database: URLs, engines (SQLite pragmas, pre-ping) and the retries of a
database that is briefly unreachable (a restarting server, a locked SQLite file).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

log = logging.getLogger("tuner.store.storage")

DEFAULT_DB_URL = "sqlite:///tuner.db"


def resolve_url(db: str | None) -> str:
    """``--db`` or ``TUNER_DB_URL`` or the default; a bare path means an SQLite file."""
    url = db or os.environ.get("TUNER_DB_URL") or DEFAULT_DB_URL
    if "://" not in url:
        url = f"sqlite:///{Path(url).expanduser()}"
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL: readers never block the writer. synchronous=NORMAL: a commit survives a killed
    # process (not a power cut), without an fsync per commit.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


#: Seconds a runner keeps retrying a database it cannot reach before it gives the study up (its lease lapses).
RUNNER_RETRY_S = 30.0
T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """Whether a database error is a blip worth retrying (a lost or refused connection, a locked SQLite
    file), not a bug or a constraint violation. Looks through wrappers such as Optuna's storage errors."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, sa_exc.IntegrityError):
            return False
        if isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)):
            return True
        if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        seen += 1
    return False


def retry_transient(fn: Callable[[], T], retry_s: float, what: str) -> T:
    """``fn()``, called again with backoff (0.1 s doubling to 2 s) while it fails on a transient database
    error and fewer than ``retry_s`` seconds have passed; the last error is raised after that."""
    deadline = time.monotonic() + retry_s
    delay = 0.1
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("database unreachable (%s): retrying %s in %.1f s", type(exc).__name__, what, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def _retry_connect(engine: Engine, retry_s: float) -> None:
    """Let a new connection wait up to ``retry_s`` seconds for a server that is restarting."""

    @event.listens_for(engine, "do_connect")
    def connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        return retry_transient(lambda: _wrapped_connect(dialect, cargs, cparams), retry_s, "a connection")


def _wrapped_connect(dialect: Any, cargs: Any, cparams: Any) -> Any:
    try:
        return dialect.connect(*cargs, **cparams)
    except dialect.loaded_dbapi.Error as exc:  # as SQLAlchemy would wrap it, so is_transient can read it
        raise sa_exc.DBAPIError.instance(None, None, exc, dialect.loaded_dbapi.Error) from exc


def _ping_on_checkout(engine: Engine) -> None:
    """Pre-ping for an engine made elsewhere (Optuna's): a pooled connection the server dropped is
    replaced on checkout instead of failing the next statement (what ``pool_pre_ping`` does)."""

    @event.listens_for(engine, "checkout")
    def ping(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        try:
            cur = dbapi_conn.cursor()
            cur.execute("SELECT 1")
            cur.close()
        except Exception as exc:
            raise sa_exc.DisconnectionError() from exc


def tune_sqlite_engine(engine: Engine, retry_s: float = RUNNER_RETRY_S) -> None:
    """Apply this module's engine settings to an engine made elsewhere (Optuna's), from its next
    connection on: the SQLite pragmas below, or on a server, pre-ping and connections that wait for a
    restarting server for up to ``retry_s`` seconds."""
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        _ping_on_checkout(engine)
        _retry_connect(engine, retry_s)
    engine.dispose()


class UnreadableJSON(dict):  # type: ignore[type-arg]
    """What a JSON column reads as when its stored text does not parse (written around the service, e.g. by
    hand in SQL): empty, ``reason`` saying why. A read shows the row with that error instead of failing every
    query that selects it (the whole study list)."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


def _json_loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        return UnreadableJSON(f"{exc.args[0] if exc.args else exc}, in {text[:40]!r}")


def make_engine(url: str, retry_s: float = 0.0) -> Engine:
    """An engine (with pre-ping for a database server); on a server, a new connection waits up to ``retry_s`` s
    for it to come back. A JSON column whose text does not parse reads as :class:`UnreadableJSON`."""
    if url.startswith("sqlite"):
        # No pre-ping: a SQLite connection is a file handle no server can drop, and a ping on every
        # checkout was a tenth of a loaded server's time.
        engine = create_engine(url, connect_args={"timeout": 30}, json_deserializer=_json_loads)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    engine = create_engine(url, pool_pre_ping=True, json_deserializer=_json_loads)
    if retry_s > 0:
        _retry_connect(engine, retry_s)
    return engine
