"""The Brain's tables (SQLAlchemy 2.x declarative models); every name starts with `brain_`.

The schema is created only by the Alembic history (migrations/versions/
0001_brain.py, 0006_layer_profiles.py, 0007_rubick_models.py);
tests/integration/test_brain_storage.py checks that autogenerate finds no difference
between these models and the migrations.
Times are seconds since the Unix epoch (float), as in the contracts.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gearshift.common.db import NAMING, BigId


class Base(DeclarativeBase):
    """Declarative base of the Brain's models."""

    metadata = sa.MetaData(naming_convention=NAMING)


metadata = Base.metadata


class Job(Base):
    """A job as the Brain knows it: spec, history-matching keys, lifecycle."""

    __tablename__ = "brain_jobs"

    job_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    tenant: Mapped[str] = mapped_column(sa.String(64), index=True)
    model_type: Mapped[str] = mapped_column(sa.String(128), index=True)
    dataset_name: Mapped[str] = mapped_column(sa.String(128), index=True)
    num_ests: Mapped[int] = mapped_column(sa.Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    status: Mapped[str] = mapped_column(sa.String(16), index=True)
    submitted_at: Mapped[float] = mapped_column(sa.Float)
    started_at: Mapped[float | None] = mapped_column(sa.Float)
    finished_at: Mapped[float | None] = mapped_column(sa.Float)
    exit_reason: Mapped[str] = mapped_column(sa.String(256), default="")

    __table_args__ = (
        sa.Index("ix_brain_jobs_submitted", "submitted_at", "job_id"),
        sa.Index("ix_brain_jobs_history", "model_type", "dataset_name", "status", "finished_at"),
    )


class JobEvent(Base):
    """A recorded lifecycle event; its id makes ReportJobEvent idempotent."""

    __tablename__ = "brain_job_events"

    event_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    job_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("brain_jobs.job_id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(sa.String(16))
    time: Mapped[float] = mapped_column(sa.Float)
    node_id: Mapped[str] = mapped_column(sa.String(128), default="")
    exit_reason: Mapped[str] = mapped_column(sa.String(256), default="")


class JobNode(Base):
    """A node (process, worker or PS pod) of a job: its resources, device and status."""

    __tablename__ = "brain_job_nodes"

    job_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("brain_jobs.job_id", ondelete="CASCADE"), primary_key=True
    )
    node_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    role: Mapped[str] = mapped_column(sa.String(16))
    cpu_cores: Mapped[float] = mapped_column(sa.Float)
    memory_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    accelerator_type: Mapped[str] = mapped_column(sa.String(64), default="")
    device_count: Mapped[int] = mapped_column(sa.Integer, default=0)
    status: Mapped[str] = mapped_column(sa.String(32))
    exit_reason: Mapped[str] = mapped_column(sa.String(256), default="")
    started_at: Mapped[float | None] = mapped_column(sa.Float)
    finished_at: Mapped[float | None] = mapped_column(sa.Float)


class SampleBatch(Base):
    """An ingested batch of samples; its id makes ReportSamples idempotent."""

    __tablename__ = "brain_sample_batches"

    batch_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    job_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("brain_jobs.job_id", ondelete="CASCADE"), index=True
    )
    received_at: Mapped[float] = mapped_column(sa.Float)
    sample_count: Mapped[int] = mapped_column(sa.Integer)


class Sample(Base):
    """A runtime measurement: step, throughput, CPU and memory used, devices, EST mapping."""

    __tablename__ = "brain_samples"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("brain_jobs.job_id", ondelete="CASCADE")
    )
    node_id: Mapped[str] = mapped_column(sa.String(128), default="")
    time: Mapped[float] = mapped_column(sa.Float)
    step: Mapped[int] = mapped_column(sa.BigInteger)
    steps_per_second: Mapped[float] = mapped_column(sa.Float)
    samples_per_second: Mapped[float] = mapped_column(sa.Float)
    cpu_cores_used: Mapped[float] = mapped_column(sa.Float)
    memory_bytes_used: Mapped[int] = mapped_column(sa.BigInteger)
    accelerator_type: Mapped[str] = mapped_column(sa.String(64))
    device_count: Mapped[int] = mapped_column(sa.Integer)
    ests_per_device: Mapped[list[int]] = mapped_column(sa.JSON)

    __table_args__ = (
        sa.Index("ix_brain_samples_job_step", "job_id", "step"),
        sa.Index(
            "ix_brain_samples_job_devices", "job_id", "accelerator_type", "device_count", "time"
        ),
    )


class Plan(Base):
    """A resource plan issued for a job."""

    __tablename__ = "brain_plans"

    plan_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    job_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("brain_jobs.job_id", ondelete="CASCADE"), index=True
    )
    issued_at: Mapped[float] = mapped_column(sa.Float)
    stage: Mapped[str] = mapped_column(sa.String(16))
    source: Mapped[str] = mapped_column(sa.String(16))
    plan: Mapped[dict[str, Any]] = mapped_column(sa.JSON)


class JobThroughput(Base):
    """What an ended job reached on one (accelerator type, device count): the model-history
    estimate reads these instead of scanning every sample of every job."""

    __tablename__ = "brain_job_throughputs"

    job_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("brain_jobs.job_id", ondelete="CASCADE"), primary_key=True
    )
    accelerator_type: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    device_count: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    model_type: Mapped[str] = mapped_column(sa.String(128))
    steps_per_second: Mapped[float] = mapped_column(sa.Float)
    minibatches_per_second: Mapped[float] = mapped_column(sa.Float)
    sample_count: Mapped[int] = mapped_column(sa.Integer)
    finished_at: Mapped[float] = mapped_column(sa.Float)

    __table_args__ = (
        sa.Index(
            "ix_brain_job_throughputs_model",
            "model_type",
            "accelerator_type",
            "device_count",
            "finished_at",
        ),
    )


class ReferenceThroughput(Base):
    """Reference jobs' measured throughputs (e.g. Gavel's), the matrix-completion references."""

    __tablename__ = "brain_reference_throughputs"

    model_type: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    accelerator_type: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    device_count: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    steps_per_second: Mapped[float] = mapped_column(sa.Float)
    source: Mapped[str] = mapped_column(sa.String(256), default="")


class LayerProfile(Base):
    """A model's layer profile (DeepPool), the burst-parallel planner's input, stored by key.

    `profile` is gearshift.brain.deeppool.profiles.graph_to_dict's plain data; `digest`
    (its SHA-256) makes storing the same profile again a no-op.
    """

    __tablename__ = "brain_layer_profiles"

    profile_key: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    model_type: Mapped[str] = mapped_column(sa.String(128), index=True)
    device: Mapped[str] = mapped_column(sa.String(256))
    num_layers: Mapped[int] = mapped_column(sa.Integer)
    global_batch: Mapped[int] = mapped_column(sa.Integer)
    digest: Mapped[str] = mapped_column(sa.String(64))
    profile: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    stored_at: Mapped[float] = mapped_column(sa.Float)


class RubickWorkload(Base):
    """A job's or model key's workload for Rubick's performance model (plain data of
    gearshift.brain.rubick.workload_to_dict), with its SHA-256 digest."""

    __tablename__ = "brain_rubick_workloads"

    subject_kind: Mapped[str] = mapped_column(sa.String(8), primary_key=True)  # job / model
    subject: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    workload: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    digest: Mapped[str] = mapped_column(sa.String(64))
    stored_at: Mapped[float] = mapped_column(sa.Float)


class RubickRun(Base):
    """One profiled configuration of a subject: a plan on resources and its iteration time.
    `run_key` names the configuration (plan, placement, CPUs per GPU, global batch), so
    storing the same configuration again replaces its measurement."""

    __tablename__ = "brain_rubick_runs"

    subject_kind: Mapped[str] = mapped_column(sa.String(8), primary_key=True)
    subject: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    run_key: Mapped[str] = mapped_column(sa.String(256), primary_key=True)
    config: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    iteration_ms: Mapped[float] = mapped_column(sa.Float)
    source: Mapped[str] = mapped_column(sa.String(16))  # profile / samples
    stored_at: Mapped[float] = mapped_column(sa.Float)


class RubickFit(Base):
    """A subject's fitted Rubick model: the 7 parameters (Eq. 1), the cluster it was priced
    on, the fit's RMSLE and how many runs it saw."""

    __tablename__ = "brain_rubick_fits"

    subject_kind: Mapped[str] = mapped_column(sa.String(8), primary_key=True)
    subject: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    params: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    cluster: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    workload_digest: Mapped[str] = mapped_column(sa.String(64))
    rmsle: Mapped[float] = mapped_column(sa.Float)
    run_count: Mapped[int] = mapped_column(sa.Integer)
    runs_from_samples: Mapped[int] = mapped_column(sa.Integer)
    offload_runs: Mapped[int] = mapped_column(sa.Integer)
    fit_seconds: Mapped[float] = mapped_column(sa.Float)
    fitted_at: Mapped[float] = mapped_column(sa.Float)


def _table(model: type[Base]) -> sa.Table:
    table = model.__table__
    assert isinstance(table, sa.Table)
    return table


# The tables, typed, for Core statements.
jobs = _table(Job)
job_events = _table(JobEvent)
job_nodes = _table(JobNode)
sample_batches = _table(SampleBatch)
samples = _table(Sample)
plans = _table(Plan)
job_throughputs = _table(JobThroughput)
reference_throughputs = _table(ReferenceThroughput)
layer_profiles = _table(LayerProfile)
rubick_workloads = _table(RubickWorkload)
rubick_runs = _table(RubickRun)
rubick_fits = _table(RubickFit)
