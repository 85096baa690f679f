"""The one Alembic history upgrades and downgrades on SQLite and on the real PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy

from gearshift.common.db import create_engine, database_url, downgrade, migrate
from gearshift.common.errors import ValidationError


def _revision(url: str) -> str | None:
    engine = create_engine(url)
    with engine.connect() as conn:
        value = conn.execute(sqlalchemy.text("select version_num from alembic_version")).scalar()
    engine.dispose()
    return value


def _check_up_and_down(url: str) -> None:
    migrate(url)
    head = _revision(url)
    assert head is not None
    downgrade(url)
    assert _revision(url) is None
    migrate(url)
    assert _revision(url) == head


def test_sqlite(tmp_path: Path) -> None:
    _check_up_and_down(f"sqlite:///{tmp_path / 'gs.db'}")


def test_postgres(postgres_db: str) -> None:
    _check_up_and_down(postgres_db)


def test_postgres_urls_use_psycopg2() -> None:
    assert database_url("postgresql://u@h/db").drivername == "postgresql+psycopg2"
    assert database_url("postgres://u@h/db").drivername == "postgresql+psycopg2"


@pytest.mark.parametrize("url", ["not a url", "mysql://u@h/db"])
def test_bad_urls_are_named(url: str) -> None:
    with pytest.raises(ValidationError, match="database_url"):
        database_url(url)
