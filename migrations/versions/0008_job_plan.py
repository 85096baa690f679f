"""Scheduler: a job's current execution plan (Rubick), stored with the job.

The plan a job's placement runs (gradient checkpointing, ESTs per device, threads,
optimizer offload) is part of what the scheduler decided; a restarted scheduler resumes
the job on the same plan instead of the default, and does not restart a running job only
because it forgot the plan. A serialized gearshift.v1.ExecutionPlan; NULL for jobs
written before this column (read as the default plan).

Revision ID: 0008_job_plan
Revises: 0007_rubick_models
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_job_plan"
down_revision = "0007_rubick_models"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sched_jobs") as batch:  # batch: SQLite alters by copying
        batch.add_column(sa.Column("plan", sa.LargeBinary, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sched_jobs") as batch:
        batch.drop_column("plan")
