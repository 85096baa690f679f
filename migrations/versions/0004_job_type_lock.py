"""Scheduler: the accelerator type a D0/D1 job is held to for its life (its first placement's).

EasyScale's D1 keeps a job's bits across placements on one kind of device only, so
a D1 job that ran on one type must never run on another; the type survives a
scheduler restart with the job.

Revision ID: 0004_job_type_lock
Revises: 0003_job_restarts
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_job_type_lock"
down_revision = "0003_job_restarts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sched_jobs") as batch:  # batch: SQLite alters by copying
        batch.add_column(sa.Column("locked_type", sa.String(64), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("sched_jobs") as batch:
        batch.drop_column("locked_type")
