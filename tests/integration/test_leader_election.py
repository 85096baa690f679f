"""Leader election on PostgreSQL (scheduler/state/leader.py): one holder, a standby that
takes over once the holder lets go, and an epoch raised by each leader."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gearshift.common.db import database_url, migrate
from gearshift.scheduler.state.leader import LOCK_KEY, Leadership, elects, epoch_is, next_epoch
from gearshift.scheduler.state.store import SqlStore
from tests.helpers import wait_until


def test_one_leader_at_a_time_and_each_a_new_epoch(postgres_db: str) -> None:
    migrate(postgres_db)
    store = SqlStore(postgres_db)
    first, second = Leadership(postgres_db), Leadership(postgres_db)
    try:
        first.acquire(timeout=10)
        assert next_epoch(store) == 1
        with pytest.raises(TimeoutError, match=r"not elected leader within 0\.3 s"):
            second.acquire(timeout=0.3)
        first.close()  # as a killed leader's connection closing would
        second.acquire(timeout=10)
        assert second.held and next_epoch(store) == 2
    finally:
        first.close()
        second.close()
        store.close()


def test_sqlite_runs_one_scheduler_without_an_election(tmp_path: object) -> None:
    assert not elects(f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(ValueError, match="leader election needs PostgreSQL"):
        Leadership(f"sqlite:///{tmp_path}/s.db")


def _lock_holder(url: str) -> int | None:
    """The pid of the backend that holds the leader lock."""
    engine = sa.create_engine(database_url(url))
    try:
        with engine.connect() as conn:
            return conn.execute(
                sa.text(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND objid = :low AND database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database())"
                ),
                {"low": LOCK_KEY & 0xFFFFFFFF},
            ).scalar()
    finally:
        engine.dispose()


def _terminate(url: str, pid: int) -> None:
    engine = sa.create_engine(database_url(url))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    finally:
        engine.dispose()


def test_a_lost_lock_is_taken_again_unless_another_led_meanwhile(postgres_db: str) -> None:
    migrate(postgres_db)
    store = SqlStore(postgres_db)
    leader = Leadership(postgres_db, poll_seconds=0.05)
    lost: list[str] = []
    try:
        leader.acquire(timeout=10)
        epoch = next_epoch(store)
        leader.watch(lambda: epoch_is(store, epoch), lost.append, every=0.1)
        first = _lock_holder(postgres_db)
        assert first is not None
        _terminate(postgres_db, first)  # as a database restart would drop it
        wait_until(lambda: _lock_holder(postgres_db) not in (None, first), 10, "lock retaken")
        assert not lost
        next_epoch(store)  # another scheduler led while the lock was away
        _terminate(postgres_db, _lock_holder(postgres_db) or 0)
        wait_until(lambda: lost, 10, "the deposed leader told")
        assert lost == ["another scheduler led while the lock was lost"]
    finally:
        leader.close()
        store.close()
