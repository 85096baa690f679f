"""Scheduler tables: jobs, job events, workers, tasks (allocations), state.

Models: gearshift.scheduler.state.models.

Revision ID: 0002_scheduler
Revises: 0001_brain
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_scheduler"
down_revision = "0001_brain"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "sched_jobs",
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("state", sa.Integer(), nullable=False),
        sa.Column("spec", sa.LargeBinary(), nullable=False),
        sa.Column("idempotency_key", sa.String(128), nullable=True),
        sa.Column("submitted_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=False),
        sa.Column("progress", sa.LargeBinary(), nullable=False),
        sa.Column("placement", sa.LargeBinary(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("rescale_count", sa.Integer(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("final_digest", sa.String(128), nullable=False),
        sa.Column("last_sequence", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_sched_jobs"),
        sa.UniqueConstraint("idempotency_key", name="uq_sched_jobs_idempotency_key"),
    )
    op.create_index("ix_sched_jobs_name", "sched_jobs", ["name"])
    op.create_index("ix_sched_jobs_tenant", "sched_jobs", ["tenant"])
    op.create_index("ix_sched_jobs_state", "sched_jobs", ["state"])
    op.create_index("ix_sched_jobs_newest", "sched_jobs", ["submitted_at", "job_id"])

    op.create_table(
        "sched_job_events",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("type", sa.Integer(), nullable=False),
        sa.Column("state", sa.Integer(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("progress", sa.LargeBinary(), nullable=False),
        sa.Column("placement", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["sched_jobs.job_id"],
            name="fk_sched_job_events_job_id_sched_jobs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_sched_job_events"),
        sa.UniqueConstraint("job_id", "sequence", name="uq_sched_job_events_seq"),
    )

    op.create_table(
        "sched_workers",
        sa.Column("worker_id", sa.String(128), nullable=False),
        sa.Column("address", sa.String(256), nullable=False),
        sa.Column("hostname", sa.String(256), nullable=False),
        sa.Column("devices", sa.LargeBinary(), nullable=False),
        sa.Column("alive", sa.Boolean(), nullable=False),
        sa.Column("registered_at", sa.Float(), nullable=False),
        sa.Column("last_heartbeat_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name="pk_sched_workers"),
    )

    op.create_table(
        "sched_tasks",
        sa.Column("task_id", sa.String(192), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("worker_id", sa.String(128), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("state", sa.Integer(), nullable=False),
        sa.Column("local_ranks", sa.String(1024), nullable=False),
        sa.Column("rendezvous_address", sa.String(256), nullable=False),
        sa.Column("lease_expires_at", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=False),
        sa.Column("checkpoint_path", sa.String(1024), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["sched_jobs.job_id"],
            name="fk_sched_tasks_job_id_sched_jobs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("task_id", name="pk_sched_tasks"),
    )
    op.create_index("ix_sched_tasks_job_id", "sched_tasks", ["job_id"])
    op.create_index("ix_sched_tasks_worker_id", "sched_tasks", ["worker_id"])

    op.create_table(
        "sched_state",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_sched_state"),
    )


def downgrade() -> None:
    op.drop_table("sched_state")
    op.drop_index("ix_sched_tasks_worker_id", table_name="sched_tasks")
    op.drop_index("ix_sched_tasks_job_id", table_name="sched_tasks")
    op.drop_table("sched_tasks")
    op.drop_table("sched_workers")
    op.drop_table("sched_job_events")
    op.drop_index("ix_sched_jobs_newest", table_name="sched_jobs")
    op.drop_index("ix_sched_jobs_state", table_name="sched_jobs")
    op.drop_index("ix_sched_jobs_tenant", table_name="sched_jobs")
    op.drop_index("ix_sched_jobs_name", table_name="sched_jobs")
    op.drop_table("sched_jobs")
