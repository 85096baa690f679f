"""Schema upgrades for the Brain's database, serialized across processes.

Several daemons (or parallel tests) may start on one database at once; the
Alembic upgrade itself is not safe to run twice concurrently, so it runs
under a lock: a PostgreSQL advisory lock, or a file lock beside the SQLite
file.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL

from gearshift.common.db import database_url, migrate

#: Advisory-lock key of Gearshift schema upgrades (any constant shared by all daemons).
ADVISORY_LOCK_KEY = 0x6765_6172_7368


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL (None for in-memory databases)."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(str(url.database))


@contextmanager
def schema_lock(url: str | URL) -> Iterator[None]:
    """Hold the cross-process lock of schema upgrades on this database."""
    parsed = database_url(url)
    path = sqlite_path(parsed)
    if parsed.get_backend_name() == "sqlite":
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
    engine = sa.create_engine(parsed, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": ADVISORY_LOCK_KEY})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_LOCK_KEY})
                conn.commit()
    finally:
        engine.dispose()


def upgrade(url: str | URL) -> None:
    """Upgrade the schema to the newest revision (Alembic `upgrade head`), under the lock."""
    parsed = database_url(url)
    path = sqlite_path(parsed)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    with schema_lock(parsed):
        migrate(parsed)
