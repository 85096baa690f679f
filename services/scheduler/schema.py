"""Schema upgrades of the scheduler's database, serialized across processes.

The Brain and the scheduler share one Alembic history and may start on one
database at the same time; an upgrade is not safe to run twice concurrently.
Both take the same lock first: the PostgreSQL advisory lock ADVISORY_LOCK_KEY,
or a `<file>.migrate-lock` file lock beside a SQLite database (the convention
of gearshift.brain.schema; a shared helper in gearshift.common.db would be the
one place for it).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL

from gearshift.common.db import database_url, migrate

#: Advisory-lock key of Gearshift schema upgrades, shared by every daemon.
ADVISORY_LOCK_KEY = 0x6765_6172_7368


@contextmanager
def schema_lock(url: str | URL) -> Iterator[None]:
    """Hold the cross-process lock of schema upgrades on this database."""
    parsed = database_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            yield
            return
        path = Path(str(parsed.database))
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
    """Upgrade the schema at `url` to the newest revision, under the lock."""
    with schema_lock(url):
        migrate(url)
