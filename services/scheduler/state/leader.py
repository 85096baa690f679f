"""Active/standby schedulers on one PostgreSQL database: the leader holds an advisory lock.

Every scheduler started on PostgreSQL first takes a session-level advisory lock on a
connection of its own and keeps that connection open while it runs. The first to take it
leads; the others are standbys that retry every POLL_SECONDS, answering reads from the
store and refusing writes with the leader's address meanwhile (api/standby.py). When the
leader dies (even by SIGKILL) its connection closes and PostgreSQL frees the lock at
once: a standby takes it, raises the leader epoch in the store, records its address, and
starts as a restarted scheduler does, from the store (Scheduler.recover). The epoch
fences the deposed leader at the workers (gearshift.worker.fence).

A leader that loses its lock connection (the database restarted, a partition) takes the
lock again once the database answers, and leads on if no other scheduler raised the epoch
meanwhile; otherwise it exits at once (`on_lost`), and the fence covers the moment before.
While the database is away it cannot start a task anyway: tasks are saved before any
StartTask is sent.
SQLite, the embedded default, has no such lock: a single scheduler runs there, epoch 0.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from gearshift.common.db import database_url
from gearshift.scheduler.state.store import Store

log = logging.getLogger("gearshift.scheduler.leader")

# The advisory lock's key (a bigint: "gshift" in ASCII); one scheduler group per database.
LOCK_KEY = 0x677368696674
EPOCH_KEY = "leader_epoch"
ADDRESS_KEY = "leader_address"
POLL_SECONDS = 0.1  # a standby's retry of the lock: most of the takeover time
CHECK_SECONDS = 1.0  # the leader's check that its lock connection is alive
# The lock connection: give up a dead database within seconds, not TCP's minutes.
CONNECT_ARGS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 2,
    "application_name": "gearshift-scheduler-leader",
}


def elects(url: str | sa.URL) -> bool:
    """Whether schedulers on this database elect a leader (PostgreSQL) or run alone."""
    return sa.make_url(url).get_backend_name() == "postgresql"


def epoch_is(store: Store, epoch: int) -> bool:
    """Whether `epoch` is still the last leader's (no other scheduler led since)."""
    return int(store.get_state(EPOCH_KEY) or 0) == epoch


def record_leader(store: Store, address: str) -> None:
    """Save where the leader serves (its advertised address), for the standbys to name."""
    store.set_state(ADDRESS_KEY, address)


def leader_address(store: Store) -> str:
    """The last leader's advertised address ("" before any leader recorded one)."""
    return store.get_state(ADDRESS_KEY) or ""


def next_epoch(store: Store) -> int:
    """The new leader's epoch: one past the last leader's, saved before it acts (only the
    lock's holder writes it, so no two leaders share one)."""
    epoch = int(store.get_state(EPOCH_KEY) or 0) + 1
    store.set_state(EPOCH_KEY, str(epoch))
    return epoch


class Leadership:
    """The advisory lock on its own connection: wait for it, hold it, notice its loss."""

    def __init__(
        self, url: str | sa.URL, *, key: int = LOCK_KEY, poll_seconds: float = POLL_SECONDS
    ) -> None:
        parsed = database_url(url)  # plain postgresql:// is psycopg2 here, as everywhere
        if not elects(parsed):
            raise ValueError(f"leader election needs PostgreSQL, not {parsed.drivername}")
        self.key = key
        self.poll_seconds = poll_seconds
        self._engine = sa.create_engine(
            parsed, poolclass=NullPool, isolation_level="AUTOCOMMIT", connect_args=CONNECT_ARGS
        )
        self._connection: sa.Connection | None = None
        self._closed = threading.Event()
        self._watch: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self._connection is not None

    def acquire(self, timeout: float | None = None) -> float:
        """Block until this process leads (TimeoutError after `timeout` seconds); returns
        the seconds waited. A lost database connection while waiting is retried."""
        start = time.monotonic()
        logged = False
        while not self._closed.is_set():
            try:
                if self._try():
                    return time.monotonic() - start
            except sa.exc.OperationalError as exc:
                log.warning("leader lock: database unreachable", extra={"error": str(exc)})
            if not logged:
                log.info("standby: another scheduler leads; waiting for its lock")
                logged = True
            if timeout is not None and time.monotonic() - start > timeout:
                raise TimeoutError(f"not elected leader within {timeout:g} s")
            self._closed.wait(self.poll_seconds)
        raise RuntimeError("leadership closed while waiting for the lock")

    def try_acquire(self) -> bool:
        """Take the lock if it is free, at once (False: another scheduler leads, or the
        database does not answer)."""
        try:
            return self._try()
        except sa.exc.OperationalError as exc:
            log.warning("leader lock: database unreachable", extra={"error": str(exc)})
            return False

    def _try(self) -> bool:
        connection = self._engine.connect()
        try:
            got = connection.execute(sa.select(sa.func.pg_try_advisory_lock(self.key))).scalar()
        except BaseException:
            connection.close()
            raise
        if got:
            self._connection = connection
            return True
        connection.close()
        return False

    def watch(
        self,
        still_ours: Callable[[], bool],
        on_lost: Callable[[str], None],
        every: float = CHECK_SECONDS,
    ) -> None:
        """Check the lock connection every `every` seconds, in a thread. When it fails (a
        database restart), take the lock again as soon as the database answers: if
        `still_ours()` (no other scheduler raised the epoch meanwhile) this one leads on,
        else `on_lost(why)`; as it is too when another scheduler holds the lock."""
        self._watch = threading.Thread(
            target=self._check, args=(still_ours, on_lost, every), name="leader-watch", daemon=True
        )
        self._watch.start()

    def _check(
        self, still_ours: Callable[[], bool], on_lost: Callable[[str], None], every: float
    ) -> None:
        while not self._closed.wait(every):
            connection = self._connection
            if connection is None:
                return
            try:
                connection.execute(sa.text("SELECT 1"))
                continue
            except sa.exc.SQLAlchemyError as exc:
                log.warning("leader lock lost; taking it again", extra={"error": str(exc)})
            self._connection = None
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                connection.close()
            why = self._retake(still_ours)
            if why:
                if not self._closed.is_set():
                    on_lost(why)
                return

    def _retake(self, still_ours: Callable[[], bool]) -> str:
        """Take the lock again once the database answers: "" when this scheduler still
        leads, else why it does not."""
        while not self._closed.wait(self.poll_seconds):
            try:
                if not self._try():
                    return "another scheduler holds the leader lock"
                if still_ours():
                    log.info("leader lock taken again; still leading")
                    return ""
                return "another scheduler led while the lock was lost"
            except sa.exc.SQLAlchemyError:
                continue  # the database is not back yet
        return ""

    def close(self) -> None:
        """Stop waiting or watching and let the lock go (closing its connection frees it)."""
        self._closed.set()
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError):  # a dead one holds no lock
                connection.close()
        self._engine.dispose()
