"""Brain tables: jobs, events, nodes, sample batches and samples, plans, per-job throughputs,
reference throughputs (gearshift.brain.models).

Revision ID: 0001_brain
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_brain"
down_revision = None
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "brain_jobs",
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("model_type", sa.String(128), nullable=False),
        sa.Column("dataset_name", sa.String(128), nullable=False),
        sa.Column("num_ests", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("submitted_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("exit_reason", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_brain_jobs"),
    )
    op.create_index("ix_brain_jobs_tenant", "brain_jobs", ["tenant"])
    op.create_index("ix_brain_jobs_model_type", "brain_jobs", ["model_type"])
    op.create_index("ix_brain_jobs_dataset_name", "brain_jobs", ["dataset_name"])
    op.create_index("ix_brain_jobs_status", "brain_jobs", ["status"])
    op.create_index("ix_brain_jobs_submitted", "brain_jobs", ["submitted_at", "job_id"])
    op.create_index(
        "ix_brain_jobs_history",
        "brain_jobs",
        ["model_type", "dataset_name", "status", "finished_at"],
    )

    op.create_table(
        "brain_job_events",
        sa.Column("event_id", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("exit_reason", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name="pk_brain_job_events"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["brain_jobs.job_id"],
            name="fk_brain_job_events_job_id_brain_jobs",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_brain_job_events_job_id", "brain_job_events", ["job_id"])

    op.create_table(
        "brain_job_nodes",
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("cpu_cores", sa.Float(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("accelerator_type", sa.String(64), nullable=False),
        sa.Column("device_count", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("exit_reason", sa.String(256), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "node_id", name="pk_brain_job_nodes"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["brain_jobs.job_id"],
            name="fk_brain_job_nodes_job_id_brain_jobs",
            ondelete="CASCADE",
        ),
    )

    op.create_table(
        "brain_sample_batches",
        sa.Column("batch_id", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("received_at", sa.Float(), nullable=False),
        sa.Column("sample_count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("batch_id", name="pk_brain_sample_batches"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["brain_jobs.job_id"],
            name="fk_brain_sample_batches_job_id_brain_jobs",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_brain_sample_batches_job_id", "brain_sample_batches", ["job_id"])

    op.create_table(
        "brain_samples",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("steps_per_second", sa.Float(), nullable=False),
        sa.Column("samples_per_second", sa.Float(), nullable=False),
        sa.Column("cpu_cores_used", sa.Float(), nullable=False),
        sa.Column("memory_bytes_used", sa.BigInteger(), nullable=False),
        sa.Column("accelerator_type", sa.String(64), nullable=False),
        sa.Column("device_count", sa.Integer(), nullable=False),
        sa.Column("ests_per_device", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_brain_samples"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["brain_jobs.job_id"],
            name="fk_brain_samples_job_id_brain_jobs",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_brain_samples_job_step", "brain_samples", ["job_id", "step"])
    op.create_index(
        "ix_brain_samples_job_devices",
        "brain_samples",
        ["job_id", "accelerator_type", "device_count", "time"],
    )

    op.create_table(
        "brain_plans",
        sa.Column("plan_id", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("issued_at", sa.Float(), nullable=False),
        sa.Column("stage", sa.String(16), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("plan_id", name="pk_brain_plans"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["brain_jobs.job_id"],
            name="fk_brain_plans_job_id_brain_jobs",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_brain_plans_job_id", "brain_plans", ["job_id"])

    op.create_table(
        "brain_job_throughputs",
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("accelerator_type", sa.String(64), nullable=False),
        sa.Column("device_count", sa.Integer(), nullable=False),
        sa.Column("model_type", sa.String(128), nullable=False),
        sa.Column("steps_per_second", sa.Float(), nullable=False),
        sa.Column("minibatches_per_second", sa.Float(), nullable=False),
        sa.Column("sample_count", sa.Integer(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint(
            "job_id", "accelerator_type", "device_count", name="pk_brain_job_throughputs"
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["brain_jobs.job_id"],
            name="fk_brain_job_throughputs_job_id_brain_jobs",
            ondelete="CASCADE",
        ),
    )
    op.create_index(
        "ix_brain_job_throughputs_model",
        "brain_job_throughputs",
        ["model_type", "accelerator_type", "device_count", "finished_at"],
    )

    op.create_table(
        "brain_reference_throughputs",
        sa.Column("model_type", sa.String(128), nullable=False),
        sa.Column("accelerator_type", sa.String(64), nullable=False),
        sa.Column("device_count", sa.Integer(), nullable=False),
        sa.Column("steps_per_second", sa.Float(), nullable=False),
        sa.Column("source", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint(
            "model_type",
            "accelerator_type",
            "device_count",
            name="pk_brain_reference_throughputs",
        ),
    )


def downgrade() -> None:
    op.drop_table("brain_reference_throughputs")
    op.drop_index("ix_brain_job_throughputs_model", table_name="brain_job_throughputs")
    op.drop_table("brain_job_throughputs")
    op.drop_index("ix_brain_plans_job_id", table_name="brain_plans")
    op.drop_table("brain_plans")
    op.drop_index("ix_brain_samples_job_devices", table_name="brain_samples")
    op.drop_index("ix_brain_samples_job_step", table_name="brain_samples")
    op.drop_table("brain_samples")
    op.drop_index("ix_brain_sample_batches_job_id", table_name="brain_sample_batches")
    op.drop_table("brain_sample_batches")
    op.drop_table("brain_job_nodes")
    op.drop_index("ix_brain_job_events_job_id", table_name="brain_job_events")
    op.drop_table("brain_job_events")
    for name in (
        "ix_brain_jobs_history",
        "ix_brain_jobs_submitted",
        "ix_brain_jobs_status",
        "ix_brain_jobs_dataset_name",
        "ix_brain_jobs_model_type",
        "ix_brain_jobs_tenant",
    ):
        op.drop_index(name, table_name="brain_jobs")
    op.drop_table("brain_jobs")
