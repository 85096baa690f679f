"""Alembic environment: one history for every Gearshift table (Brain and scheduler).

Run through gearshift.common.db.migrate (or `gearshift-brain migrate`), which
sets the database URL; autogenerate compares against every service's models.
"""

from __future__ import annotations

import importlib

import sqlalchemy
from alembic import context

# Models of each service that owns tables; each defines `metadata`.
MODEL_MODULES = ("gearshift.brain.models", "gearshift.scheduler.state.models")


def target_metadata() -> list[sqlalchemy.MetaData]:
    found = []
    for name in MODEL_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        found.append(module.metadata)
    return found


def _run(connection: sqlalchemy.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata(),
        render_as_batch=connection.dialect.name == "sqlite",  # ALTER TABLE on SQLite
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations() -> None:
    """Migrate on a connection handed in by the caller, or on one to the configured URL."""
    config = context.config
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or ""
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    with engine.connect() as connection:
        _run(connection)


run_migrations()
