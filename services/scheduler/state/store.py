"""Storage of the scheduler's state behind one interface, and its SQLAlchemy implementation.

The domain code (gearshift.scheduler.service) reads and writes plain records
through `Store`; `SqlStore` keeps them in PostgreSQL or SQLite (schema from
migrations/ only). Every method is one transaction, so a job's row and the
events that explain its change are committed together: a restarted scheduler
finds each job in the state its last event says.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gearshift.common.db import create_engine, outages
from gearshift.common.errors import ConflictError, UnavailableError
from gearshift.common.facts import ENDED_TASK_STATES, TERMINAL_STATES
from gearshift.scheduler.state import models
from gearshift.scheduler.state.records import EventRecord, JobRecord, TaskRecord, WorkerRecord
from gearshift.scheduler.state.write_batch import BatchedWrites
from gearshift.v1 import common_pb2


class Store(Protocol):
    """What the scheduler persists. Every call is atomic."""

    def create_job(self, job: JobRecord, event: EventRecord) -> JobRecord:
        """Insert a job with its first event; ConflictError if the idempotency key is taken."""

    def find_job_by_key(self, key: str) -> JobRecord | None: ...

    def get_job(self, job_id: str) -> JobRecord | None: ...

    def save_job(self, job: JobRecord, events: Sequence[EventRecord] = ()) -> None:
        """Update a job and append events, together."""

    def list_jobs(
        self,
        *,
        tenant: str,
        states: Sequence[int],
        name_prefix: str,
        limit: int,
        after: tuple[float, str] | None,
    ) -> list[JobRecord]:
        """Jobs newest first, strictly after the (submitted_at, job_id) cursor."""

    def job_counts(self) -> dict[int, int]:
        """Jobs in each JobState (states without a job are left out)."""

    def active_jobs(self) -> list[JobRecord]:
        """Jobs not yet ended, oldest first."""

    def events_after(self, job_id: str, sequence: int, limit: int = 1000) -> list[EventRecord]: ...

    def save_worker(self, worker: WorkerRecord) -> None: ...

    def save_workers(self, workers: Sequence[WorkerRecord]) -> None:
        """Save several workers in one transaction."""

    def workers(self) -> list[WorkerRecord]: ...

    def save_tasks(self, tasks: Iterable[TaskRecord]) -> None: ...

    def batch(self) -> AbstractContextManager[None]:
        """This thread's save_job and save_tasks until the end, in one transaction then
        (gearshift.scheduler.state.write_batch)."""

    def locked_batch(self, lock: AbstractContextManager[Any]) -> AbstractContextManager[None]:
        """`batch()` under `lock`, committed once the lock is let go, in the order of the
        holds (gearshift.scheduler.state.write_batch)."""

    def settle(self) -> None:
        """Wait until the writes of the holds already let go are committed."""

    def open_tasks(self) -> list[TaskRecord]:
        """Tasks not yet ended."""

    def job_tasks(self, job_id: str) -> list[TaskRecord]:
        """Every task of a job, ended ones too, oldest first (where its logs are)."""

    def has_code(self, sha256: str) -> bool: ...

    def put_code(self, sha256: str, data: bytes) -> bool:
        """Store a code package; False (and nothing written) when it is there already."""

    def get_code(self, sha256: str) -> bytes | None: ...

    def get_state(self, key: str) -> str | None: ...

    def set_state(self, key: str, value: str) -> None: ...


def _job_from_row(row: models.Job) -> JobRecord:
    spec = common_pb2.JobSpec()
    spec.ParseFromString(row.spec)
    progress = common_pb2.JobProgress()
    progress.ParseFromString(row.progress or b"")
    placement = common_pb2.Placement()
    placement.ParseFromString(row.placement or b"")
    plan = common_pb2.ExecutionPlan()
    plan.ParseFromString(row.plan or b"")
    return JobRecord(
        job_id=row.job_id,
        spec=spec,
        state=row.state,
        submitted_at=row.submitted_at,
        idempotency_key=row.idempotency_key,
        started_at=row.started_at,
        finished_at=row.finished_at,
        progress=progress,
        placement=placement,
        generation=row.generation,
        rescale_count=row.rescale_count,
        restart_count=row.restart_count,
        locked_type=row.locked_type,
        message=row.message,
        final_digest=row.final_digest,
        last_sequence=row.last_sequence,
        plan=plan,
        process_plan=row.process_plan or "",
        ps_plan=row.ps_plan or "",
        ps_pin=row.ps_pin or "",
    )


_JOBS = models.metadata.tables[models.Job.__tablename__]
_TASKS = models.metadata.tables[models.Task.__tablename__]
_INSERT_JOB = sa.insert(_JOBS)
_INSERT_EVENT = sa.insert(models.metadata.tables[models.JobEvent.__tablename__])
# Executed with many rows: each names its job as `the_job_id` (a column's name is taken).
_UPDATE_JOB = sa.update(_JOBS).where(_JOBS.c.job_id == sa.bindparam("the_job_id"))


def _job_with_event_statement() -> sa.Executable:
    """INSERT the job in a CTE and its first event after it: one atomic statement
    (PostgreSQL's data-modifying WITH; the event's foreign key is checked at its end). Its
    parameters are the job's columns prefixed `job_`, the event's `event_` (built once:
    building it per call cost a submission 0.2 ms of the interpreter)."""
    events = _INSERT_EVENT.table
    job = _INSERT_JOB.values({c.name: sa.bindparam(f"job_{c.name}") for c in _JOBS.columns})
    event_columns = [c for c in events.columns if not c.primary_key]  # its id: a sequence's
    return _INSERT_EVENT.values(
        {c.name: sa.bindparam(f"event_{c.name}") for c in event_columns}
    ).add_cte(job.cte("new_job"))


_JOB_WITH_EVENT = _job_with_event_statement()


def _job_with_event_params(job: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    """_JOB_WITH_EVENT's parameters."""
    return {
        **{f"job_{k}": v for k, v in job.items()},
        **{f"event_{k}": v for k, v in event.items()},
    }


def _task_upsert(dialect: str) -> sa.Executable:
    """INSERT ... ON CONFLICT (task_id) DO UPDATE, in the database's own dialect."""
    columns = [c.name for c in _TASKS.columns if c.name != "task_id"]
    insert = pg_insert(_TASKS) if dialect == "postgresql" else sqlite_insert(_TASKS)
    return insert.on_conflict_do_update(
        index_elements=[_TASKS.c.task_id], set_={c: insert.excluded[c] for c in columns}
    )


def _job_values(job: JobRecord) -> dict[str, object]:
    return {
        "name": job.spec.name,
        "tenant": job.spec.tenant,
        "state": job.state,
        "spec": job.spec.SerializeToString(deterministic=True),
        "idempotency_key": job.idempotency_key,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "progress": job.progress.SerializeToString(deterministic=True),
        "placement": job.placement.SerializeToString(deterministic=True),
        "generation": job.generation,
        "rescale_count": job.rescale_count,
        "restart_count": job.restart_count,
        "locked_type": job.locked_type,
        "message": job.message,
        "final_digest": job.final_digest,
        "last_sequence": job.last_sequence,
        "plan": job.plan.SerializeToString(deterministic=True),
        "process_plan": job.process_plan or None,
        "ps_plan": job.ps_plan or None,
        "ps_pin": job.ps_pin or None,
    }


def _event_values(event: EventRecord) -> dict[str, Any]:
    return {
        "job_id": event.job_id,
        "sequence": event.sequence,
        "time": event.time,
        "type": event.type,
        "state": event.state,
        "message": event.message,
        "progress": event.progress.SerializeToString(deterministic=True) if event.progress else b"",
        "placement": (
            event.placement.SerializeToString(deterministic=True) if event.placement else b""
        ),
    }


def _event_from_row(row: models.JobEvent) -> EventRecord:
    progress = common_pb2.JobProgress()
    progress.ParseFromString(row.progress or b"")
    placement = common_pb2.Placement()
    placement.ParseFromString(row.placement or b"")
    return EventRecord(
        job_id=row.job_id,
        sequence=row.sequence,
        time=row.time,
        type=row.type,
        state=row.state,
        message=row.message,
        progress=progress,
        placement=placement,
    )


def _devices_blob(devices: Sequence[common_pb2.DeviceGroup]) -> bytes:
    holder = common_pb2.Resources(devices=devices)
    return holder.SerializeToString(deterministic=True)


def _devices_from_blob(blob: bytes) -> list[common_pb2.DeviceGroup]:
    holder = common_pb2.Resources()
    holder.ParseFromString(blob)
    return list(holder.devices)


def _task_row(task: TaskRecord) -> dict[str, object]:
    return {
        "task_id": task.task_id,
        "job_id": task.job_id,
        "worker_id": task.worker_id,
        "generation": task.generation,
        "state": task.state,
        "local_ranks": json.dumps(list(task.local_ranks)),
        "rendezvous_address": task.rendezvous_address,
        "lease_expires_at": task.lease_expires_at,
        "created_at": task.created_at,
        "ended_at": task.ended_at,
        "checkpoint_path": task.checkpoint_path,
        "message": task.message,
    }


def _task_from_row(row: models.Task) -> TaskRecord:
    return TaskRecord(
        task_id=row.task_id,
        job_id=row.job_id,
        worker_id=row.worker_id,
        generation=row.generation,
        state=row.state,
        local_ranks=tuple(json.loads(row.local_ranks or "[]")),
        rendezvous_address=row.rendezvous_address,
        lease_expires_at=row.lease_expires_at,
        created_at=row.created_at,
        ended_at=row.ended_at,
        checkpoint_path=row.checkpoint_path,
        message=row.message,
    )


# A batch's rows, made under the lock: jobs, events, tasks (SqlStore._rows).
_Rows = tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]


class SqlStore(BatchedWrites):
    """Store on SQLAlchemy (PostgreSQL or SQLite); the schema must be migrated already."""

    def __init__(self, url_or_engine: str | Engine) -> None:
        super().__init__()
        self.engine = (
            create_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
        )
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # Submissions on PostgreSQL: connections of their own, in autocommit from the start
        # (switching a pooled connection to it and back costs two SETs: round trips).
        self._submissions = (
            create_engine(self.engine.url, isolation_level="AUTOCOMMIT")
            if self.engine.dialect.name == "postgresql"
            else None
        )
        self._upsert_tasks = _task_upsert(self.engine.dialect.name)

    def close(self) -> None:
        self.engine.dispose()
        if self._submissions is not None:
            self._submissions.dispose()

    @contextmanager
    def _session(self) -> Iterator[Session]:
        with outages(), self._sessions() as session:
            yield session

    @contextmanager
    def _transaction(self) -> Iterator[sa.Connection]:
        """A connection in a transaction, for the Core writes of the hot paths (a
        submission, a round's batch): a Session's own bookkeeping cost a submission more
        than its two inserts (bench/load.py)."""
        with outages(), self.engine.begin() as connection:
            yield connection

    def check(self) -> None:
        """Fail with UnavailableError when the schema is missing (not migrated)."""
        try:
            with self._session() as session:
                session.execute(sa.select(sa.func.count()).select_from(models.State))
        except sa.exc.SQLAlchemyError as exc:
            raise UnavailableError(
                f"scheduler tables are missing or unreachable (run the migrations): {exc}"
            ) from None

    # Jobs ---------------------------------------------------------------------
    def create_job(self, job: JobRecord, event: EventRecord) -> JobRecord:
        """Core inserts on the tables, not the ORM's: a submission's cost was mostly building
        and flushing ORM objects (bench/load.py). On PostgreSQL the job and its event go in
        one statement committed on its own, one round trip instead of four (BEGIN, two
        inserts, COMMIT): under load each round trip waited for the busy host's CPU, and a
        submission's time was theirs (bench/load.py at 1,000 workers: 0-95 ms each)."""
        values = {"job_id": job.job_id, **_job_values(job)}
        try:
            if self._submissions is not None:
                with outages(), self._submissions.connect() as connection:
                    connection.execute(
                        _JOB_WITH_EVENT, _job_with_event_params(values, _event_values(event))
                    )
            else:
                with self._transaction() as connection:
                    connection.execute(_INSERT_JOB, values)
                    connection.execute(_INSERT_EVENT, _event_values(event))
        except IntegrityError:
            raise ConflictError(f"job {job.job_id!r} or its idempotency key exists") from None
        return job

    def find_job_by_key(self, key: str) -> JobRecord | None:
        with self._session() as session:
            row = session.scalars(
                sa.select(models.Job).where(models.Job.idempotency_key == key)
            ).first()
            return _job_from_row(row) if row else None

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._session() as session:
            row = session.get(models.Job, job_id)
            return _job_from_row(row) if row else None

    def _rows(
        self, jobs: Sequence[JobRecord], events: Sequence[EventRecord], tasks: Sequence[TaskRecord]
    ) -> _Rows:
        return (
            [{"the_job_id": j.job_id, **_job_values(j)} for j in jobs],
            [_event_values(e) for e in events],
            [_task_row(t) for t in tasks],
        )

    def _commit(self, rows: _Rows) -> None:
        """Jobs updated (a job not stored is skipped), events appended, tasks upserted, in
        one transaction, each kind in one executemany."""
        jobs, events, tasks = rows
        with self._transaction() as connection:
            if jobs:
                connection.execute(_UPDATE_JOB, jobs)
            if events:
                connection.execute(_INSERT_EVENT, events)
            if tasks:
                connection.execute(self._upsert_tasks, tasks)

    def list_jobs(
        self,
        *,
        tenant: str,
        states: Sequence[int],
        name_prefix: str,
        limit: int,
        after: tuple[float, str] | None,
    ) -> list[JobRecord]:
        query = sa.select(models.Job)
        if tenant:
            query = query.where(models.Job.tenant == tenant)
        if states:
            query = query.where(models.Job.state.in_(list(states)))
        if name_prefix:
            escaped = name_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            query = query.where(models.Job.name.like(escaped + "%", escape="\\"))
        if after is not None:
            when, job_id = after
            query = query.where(
                sa.or_(
                    models.Job.submitted_at < when,
                    sa.and_(models.Job.submitted_at == when, models.Job.job_id < job_id),
                )
            )
        query = query.order_by(models.Job.submitted_at.desc(), models.Job.job_id.desc())
        with self._session() as session:
            return [_job_from_row(r) for r in session.scalars(query.limit(limit))]

    def job_counts(self) -> dict[int, int]:
        query = sa.select(models.Job.state, sa.func.count()).group_by(models.Job.state)
        with self._session() as session:
            return {int(state): int(count) for state, count in session.execute(query)}

    def active_jobs(self) -> list[JobRecord]:
        query = (
            sa.select(models.Job)
            .where(models.Job.state.not_in(list(TERMINAL_STATES)))
            .order_by(models.Job.submitted_at, models.Job.job_id)
        )
        with self._session() as session:
            return [_job_from_row(r) for r in session.scalars(query)]

    def events_after(self, job_id: str, sequence: int, limit: int = 1000) -> list[EventRecord]:
        query = (
            sa.select(models.JobEvent)
            .where(models.JobEvent.job_id == job_id, models.JobEvent.sequence > sequence)
            .order_by(models.JobEvent.sequence)
            .limit(limit)
        )
        with self._session() as session:
            return [_event_from_row(r) for r in session.scalars(query)]

    # Workers and tasks ---------------------------------------------------------
    def save_worker(self, worker: WorkerRecord) -> None:
        self.save_workers([worker])

    def save_workers(self, workers: Sequence[WorkerRecord]) -> None:
        with self._session() as session, session.begin():
            for worker in workers:
                session.merge(
                    models.Worker(
                        worker_id=worker.worker_id,
                        address=worker.address,
                        hostname=worker.hostname,
                        devices=_devices_blob(worker.devices),
                        alive=worker.alive,
                        registered_at=worker.registered_at,
                        last_heartbeat_at=worker.last_heartbeat_at,
                    )
                )

    def workers(self) -> list[WorkerRecord]:
        with self._session() as session:
            return [
                WorkerRecord(
                    worker_id=r.worker_id,
                    address=r.address,
                    hostname=r.hostname,
                    devices=_devices_from_blob(r.devices),
                    alive=r.alive,
                    registered_at=r.registered_at,
                    last_heartbeat_at=r.last_heartbeat_at,
                )
                for r in session.scalars(sa.select(models.Worker).order_by(models.Worker.worker_id))
            ]

    def open_tasks(self) -> list[TaskRecord]:
        query = (
            sa.select(models.Task)
            .where(models.Task.state.not_in(list(ENDED_TASK_STATES)))
            .order_by(models.Task.created_at, models.Task.task_id)
        )
        with self._session() as session:
            return [_task_from_row(r) for r in session.scalars(query)]

    def job_tasks(self, job_id: str) -> list[TaskRecord]:
        query = (
            sa.select(models.Task)
            .where(models.Task.job_id == job_id)
            .order_by(models.Task.created_at, models.Task.task_id)
        )
        with self._session() as session:
            return [_task_from_row(r) for r in session.scalars(query)]

    # Code packages --------------------------------------------------------------
    def has_code(self, sha256: str) -> bool:
        query = sa.select(models.CodeBlob.sha256).where(models.CodeBlob.sha256 == sha256)
        with self._session() as session:
            return session.scalar(query) is not None

    def put_code(self, sha256: str, data: bytes) -> bool:
        try:
            with self._session() as session, session.begin():
                if session.get(models.CodeBlob, sha256) is not None:
                    return False
                session.add(
                    models.CodeBlob(
                        sha256=sha256, size=len(data), data=data, created_at=time.time()
                    )
                )
        except IntegrityError:  # a concurrent upload of the same package stored it first
            return False
        return True

    def get_code(self, sha256: str) -> bytes | None:
        with self._session() as session:
            row = session.get(models.CodeBlob, sha256)
            return bytes(row.data) if row is not None else None

    # Scheduler-wide values ------------------------------------------------------
    def get_state(self, key: str) -> str | None:
        with self._session() as session:
            row = session.get(models.State, key)
            return row.value if row else None

    def set_state(self, key: str, value: str) -> None:
        with self._session() as session, session.begin():
            session.merge(models.State(key=key, value=value))
