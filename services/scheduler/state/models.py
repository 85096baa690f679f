"""The scheduler's tables (SQLAlchemy 2.x declarative models); every name starts with `sched_`.

The schema is created only by the Alembic history (migrations/versions/
0002_scheduler.py and later); tests/integration/test_sched_storage.py checks that
autogenerate finds no difference between these models and the migration for
the sched_ tables. Times are seconds since the Unix epoch (float), as in the
contracts. Protobuf messages (spec, progress, placement) are stored as their
serialized bytes: exact, and read back only by this service.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gearshift.common.db import NAMING, BigId


class Base(DeclarativeBase):
    """Declarative base of the scheduler's models."""

    metadata = sa.MetaData(naming_convention=NAMING)


metadata = Base.metadata


class Job(Base):
    """A job: its spec, lifecycle state, progress and current placement."""

    __tablename__ = "sched_jobs"

    job_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(128), index=True)
    tenant: Mapped[str] = mapped_column(sa.String(64), index=True)
    state: Mapped[int] = mapped_column(sa.Integer, index=True)
    spec: Mapped[bytes] = mapped_column(sa.LargeBinary)
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(128), unique=True)
    submitted_at: Mapped[float] = mapped_column(sa.Float)
    started_at: Mapped[float] = mapped_column(sa.Float, default=0.0)
    finished_at: Mapped[float] = mapped_column(sa.Float, default=0.0)
    progress: Mapped[bytes] = mapped_column(sa.LargeBinary, default=b"")
    placement: Mapped[bytes] = mapped_column(sa.LargeBinary, default=b"")
    generation: Mapped[int] = mapped_column(sa.Integer, default=0)
    rescale_count: Mapped[int] = mapped_column(sa.Integer, default=0)
    restart_count: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    locked_type: Mapped[str] = mapped_column(sa.String(64), default="", server_default="")
    message: Mapped[str] = mapped_column(sa.Text, default="")
    final_digest: Mapped[str] = mapped_column(sa.String(128), default="")
    last_sequence: Mapped[int] = mapped_column(sa.Integer, default=0)
    # The current execution plan (serialized ExecutionPlan; NULL: the default plan).
    plan: Mapped[bytes | None] = mapped_column(sa.LargeBinary, nullable=True, default=b"")
    # The resource plan its placement runs (data-parallel / PS), and a PS job's pin (JSON;
    # NULL: none).
    process_plan: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    ps_plan: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    ps_pin: Mapped[str | None] = mapped_column(sa.Text, nullable=True)

    __table_args__ = (sa.Index("ix_sched_jobs_newest", "submitted_at", "job_id"),)


class JobEvent(Base):
    """One lifecycle event; (job_id, sequence) is unique and sequences count from 1."""

    __tablename__ = "sched_job_events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(
        sa.String(64), sa.ForeignKey("sched_jobs.job_id", ondelete="CASCADE")
    )
    sequence: Mapped[int] = mapped_column(sa.Integer)
    time: Mapped[float] = mapped_column(sa.Float)
    type: Mapped[int] = mapped_column(sa.Integer)
    state: Mapped[int] = mapped_column(sa.Integer)
    message: Mapped[str] = mapped_column(sa.Text, default="")
    progress: Mapped[bytes] = mapped_column(sa.LargeBinary, default=b"")
    placement: Mapped[bytes] = mapped_column(sa.LargeBinary, default=b"")

    __table_args__ = (sa.UniqueConstraint("job_id", "sequence", name="uq_sched_job_events_seq"),)


class Worker(Base):
    """A worker daemon: where to reach it, its devices (serialized DeviceGroups), liveness."""

    __tablename__ = "sched_workers"

    worker_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    address: Mapped[str] = mapped_column(sa.String(256))
    hostname: Mapped[str] = mapped_column(sa.String(256), default="")
    devices: Mapped[bytes] = mapped_column(sa.LargeBinary)
    alive: Mapped[bool] = mapped_column(sa.Boolean, default=True)
    registered_at: Mapped[float] = mapped_column(sa.Float)
    last_heartbeat_at: Mapped[float] = mapped_column(sa.Float)


class Task(Base):
    """An allocation: a job's processes on one worker for one placement generation."""

    __tablename__ = "sched_tasks"

    task_id: Mapped[str] = mapped_column(sa.String(192), primary_key=True)
    job_id: Mapped[str] = mapped_column(
        sa.String(64), sa.ForeignKey("sched_jobs.job_id", ondelete="CASCADE"), index=True
    )
    worker_id: Mapped[str] = mapped_column(sa.String(128), index=True)
    generation: Mapped[int] = mapped_column(sa.Integer)
    state: Mapped[int] = mapped_column(sa.Integer)
    local_ranks: Mapped[str] = mapped_column(sa.String(1024), default="")
    rendezvous_address: Mapped[str] = mapped_column(sa.String(256), default="")
    lease_expires_at: Mapped[float] = mapped_column(sa.Float, default=0.0)
    created_at: Mapped[float] = mapped_column(sa.Float)
    ended_at: Mapped[float] = mapped_column(sa.Float, default=0.0)
    checkpoint_path: Mapped[str] = mapped_column(sa.String(1024), default="")
    message: Mapped[str] = mapped_column(sa.Text, default="")


class CodeBlob(Base):
    """A user's code package (a zip archive), stored once by the SHA-256 of its bytes."""

    __tablename__ = "sched_code_blobs"

    sha256: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    size: Mapped[int] = mapped_column(sa.BigInteger)
    data: Mapped[bytes] = mapped_column(sa.LargeBinary)
    created_at: Mapped[float] = mapped_column(sa.Float)


class State(Base):
    """Small scheduler-wide values that must survive a restart (e.g. the round number)."""

    __tablename__ = "sched_state"

    key: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    value: Mapped[str] = mapped_column(sa.Text)
