"""Schema migrations of the study tables (Alembic), shipped with the package.

``upgrade(engine)`` brings a database to the newest revision: it creates the tables in an empty
database, and a database made before migrations existed (release 0.1.0, whose tables were created
and then grown by added columns) is taken up by the baseline revision, which adds whatever columns of
that schema it lacks. Alembic keeps its revision in ``tuner_alembic_version``, apart from the
``alembic_version`` table of Optuna's own storage in the same database.

Writers run it once on start (``tuner serve``, ``tuner run``, ``tuner worker``, ``tuner db upgrade``);
read-only commands never do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.engine import Connection, Engine

HERE = Path(__file__).resolve().parent
VERSION_TABLE = "tuner_alembic_version"


def _config(connection: Connection | None = None):  # -> alembic.config.Config
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.attributes["connection"] = connection
    return config


def head() -> str:
    """The newest revision this version of the package knows."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config()).get_current_head()  # type: ignore[return-value]


def current(engine: Engine) -> str | None:
    """The revision the database is at; None for an empty database or one made before migrations."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def is_current(engine: Engine) -> bool:
    return current(engine) == head()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database to ``revision`` (the newest by default), in one transaction.

    Two processes upgrading at once (``tuner serve`` and its runner) serialise: on PostgreSQL on an
    advisory lock, on SQLite on a lock file beside the database (SQLite runs DDL outside the
    transaction), so the second finds the work done instead of failing on a table the first made.
    """
    if current(engine) == head():
        return  # the common case, without taking a lock
    with _file_lock(engine), engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7361029)")  # any fixed key of ours
        from alembic import command

        command.upgrade(_config(conn), revision)


@contextlib.contextmanager
def _file_lock(engine: Engine) -> Iterator[None]:
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    if not path or path == ":memory:":
        yield
        return
    import fcntl

    with open(f"{path}.migrate-lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
