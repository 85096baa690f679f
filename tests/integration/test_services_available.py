"""The test services themselves: PostgreSQL and Redis answer (fails in CI when they do not)."""

from __future__ import annotations


def test_postgres_database_per_test(postgres_db: str) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres_db)
    with engine.connect() as conn:
        assert conn.execute(sqlalchemy.text("select 1")).scalar() == 1
    engine.dispose()


def test_redis_answers(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    assert client.ping()
    client.close()
