"""Alembic's environment: runs on the connection :func:`tuner.store.migrations.upgrade` hands it."""

from __future__ import annotations

from alembic import context

from tuner.store.migrations import VERSION_TABLE

connection = context.config.attributes.get("connection")
if connection is None:  # the alembic command line: the URL comes from the usual place
    from tuner.store.storage import make_engine, resolve_url

    with make_engine(resolve_url(None)).begin() as connection:
        context.configure(connection=connection, version_table=VERSION_TABLE, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, version_table=VERSION_TABLE, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
