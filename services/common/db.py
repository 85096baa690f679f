"""Database conventions shared by the Brain and the scheduler: URLs, engines, migrations.

PostgreSQL goes through psycopg2 in deployment, SQLite is the embedded
default; the schema is created only by the Alembic history in migrations/.
Imports SQLAlchemy, so only services (never the client) import this module.
"""

from __future__ import annotations

import argparse
import fcntl
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import URL, Engine

import gearshift.migrations
from gearshift.common.config import Option, build_parser, parse_bool
from gearshift.common.errors import UnavailableError, ValidationError
from gearshift.common.logs import LOG_FORMATS, LOG_LEVELS, configure_logging

#: A 64-bit auto-increment key; SQLite only auto-increments INTEGER PRIMARY KEY.
BigId = sqlalchemy.BigInteger().with_variant(sqlalchemy.Integer(), "sqlite")

#: Constraint and index names of every service's tables, so migrations name them the same
#: on PostgreSQL and SQLite.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

_DRIVERS = {"postgresql": "postgresql+psycopg2", "postgres": "postgresql+psycopg2"}


def unavailable(exc: Exception) -> UnavailableError:
    """The database outage behind `exc`, worded for a client (first line of the driver's)."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    return UnavailableError(f"database unavailable: {text}")


@contextmanager
def outages() -> Iterator[None]:
    """A database that cannot be reached (down, restarting, a connection cut) is
    UnavailableError, which clients retry, not a bug answered INTERNAL."""
    try:
        yield
    except (
        sqlalchemy.exc.OperationalError,
        sqlalchemy.exc.InterfaceError,
        sqlalchemy.exc.TimeoutError,
    ) as exc:
        raise unavailable(exc) from exc
    except sqlalchemy.exc.DBAPIError as exc:
        if exc.connection_invalidated:
            raise unavailable(exc) from exc
        raise


@contextmanager
def scratch_database(server_url: str | URL, prefix: str) -> Iterator[str]:
    """A new, empty database on a PostgreSQL server for one run (a test, a benchmark), named
    `prefix_<random>` and dropped afterwards; its URL. OperationalError when the server
    cannot be reached (within 5 s)."""
    admin_url = database_url(server_url)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(
        admin_url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5}
    )
    try:
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    except BaseException:
        admin.dispose()
        raise
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def database_url(url: str | URL, field: str = "database_url") -> URL:
    """Parse a database URL; plain postgresql:// means psycopg2, not SQLAlchemy 2.1's psycopg 3."""
    try:
        parsed = sqlalchemy.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        raise ValidationError(field, f"{url!r} is not a database URL") from None
    if parsed.drivername in _DRIVERS:
        parsed = parsed.set(drivername=_DRIVERS[parsed.drivername])
    if parsed.get_backend_name() not in {"postgresql", "sqlite"}:
        raise ValidationError(
            field, f"backend {parsed.get_backend_name()!r}: use postgresql or sqlite"
        )
    return parsed


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.close()


def create_engine(url: str | URL, **kwargs: Any) -> Engine:
    """An engine with pre-ping, so a restarted PostgreSQL costs a reconnect, not an error."""
    parsed = database_url(url)
    # A pool keeps `pool_size` connections and closes any more as they come back: with 5
    # kept and 10 more allowed, 100 submissions a second opened and closed 35 PostgreSQL
    # sessions a second (a backend forked and torn down for each; bench/load.py). Ten kept
    # and five more: the same ceiling of fifteen, rarely reached.
    pool: dict[str, Any] = {"pool_size": 10, "max_overflow": 5}
    if parsed.get_backend_name() == "sqlite":
        if sqlite_path(parsed) is None:  # in memory: one connection, no pool to size
            pool = {}
        engine = sqlalchemy.create_engine(
            parsed, connect_args={"check_same_thread": False}, **{**pool, **kwargs}
        )
        sqlalchemy.event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    options: dict[str, Any] = {"pool_pre_ping": True, **pool}
    if parsed.get_driver_name() == "psycopg2":  # an UPDATE of many rows: pages, not a row each
        options["executemany_mode"] = "values_plus_batch"
    options.update(kwargs)
    return sqlalchemy.create_engine(parsed, **options)


def alembic_config(url: str | URL) -> Config:
    """Alembic configuration for the one migration history, pointed at `url`."""
    config = Config()
    config.set_main_option("script_location", str(Path(gearshift.migrations.__file__).parent))
    rendered = database_url(url).render_as_string(hide_password=False)
    config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return config


#: Advisory-lock key of Gearshift schema changes, shared by every daemon.
ADVISORY_LOCK_KEY = 0x6765_6172_7368


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL (None for in-memory databases and other backends)."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(str(url.database))


@contextmanager
def schema_lock(url: str | URL) -> Iterator[None]:
    """Hold the cross-process lock of schema changes on this database.

    The Brain and the scheduler share one Alembic history and may start on one
    database at once (so may parallel tests); an upgrade is not safe to run
    twice concurrently. PostgreSQL: an advisory lock; SQLite: a file lock
    beside the database file.
    """
    parsed = database_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = sqlite_path(parsed)
        if path is None:
            yield
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with (path.parent / (path.name + ".migrate-lock")).open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    engine = sqlalchemy.create_engine(parsed, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": ADVISORY_LOCK_KEY})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(
                    sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_LOCK_KEY}
                )
                conn.commit()
    finally:
        engine.dispose()


def migrate(url: str | URL, revision: str = "head") -> None:
    """Upgrade the schema at `url` to `revision` (default: the newest), under the schema lock."""
    with schema_lock(url):
        command.upgrade(alembic_config(url), revision)


def downgrade(url: str | URL, revision: str = "base") -> None:
    """Downgrade the schema at `url` to `revision` (default: empty), under the schema lock."""
    with schema_lock(url):
        command.downgrade(alembic_config(url), revision)


def database_options(default_url: str) -> list[Option]:
    """The database flags of a daemon that owns tables (Brain, scheduler)."""
    return [
        Option(
            "database_url",
            "database: postgresql://user:pass@host/db (psycopg2) or sqlite:///path.db",
            default_url,
        ),
        Option(
            "migrate_on_start",
            "upgrade the schema to the newest revision before serving",
            True,
            parse_bool,
        ),
    ]


def tool_options(default_url: str) -> list[Option]:
    """The flags of a daemon's database subcommands (`migrate`, ...)."""
    return [
        database_options(default_url)[0],
        Option("log_level", "log level", "info", choices=LOG_LEVELS),
        Option("log_format", "log line format", "text", choices=LOG_FORMATS),
    ]


def open_database(url: str, *, migrate_first: bool) -> str:
    """The normalized URL of a daemon's database, migrated first when asked.

    Errors are ValueError / RuntimeError naming the database, which run_daemon
    reports as a failed start.
    """
    try:
        rendered = database_url(url).render_as_string(hide_password=False)
        if migrate_first:
            migrate(rendered)
    except ValidationError as exc:
        raise ValueError(exc.message) from None
    except sqlalchemy.exc.SQLAlchemyError as exc:
        raise RuntimeError(f"database {url}: {exc}") from None
    return rendered


def migrate_parser(prog: str, description: str, default_url: str) -> argparse.ArgumentParser:
    """`<daemon> migrate`'s command line."""
    return build_parser(f"{prog} migrate", description, tool_options(default_url))


def migrate_main(prog: str, description: str, argv: Sequence[str], default_url: str) -> int:
    """`<daemon> migrate [--database-url URL]`: upgrade the schema to head and exit."""
    args = migrate_parser(prog, description, default_url).parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        url = open_database(args.database_url, migrate_first=True)
    except (ValueError, RuntimeError) as exc:
        print(f"{prog} migrate: error: {exc}", file=sys.stderr)
        return 1
    print(f"{prog}: schema at head on {database_url(url).render_as_string()}")
    return 0
