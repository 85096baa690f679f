"""Scheduler: a job's restarts after failed tasks, so that `--max-restarts` survives a restart.

Revision ID: 0003_job_restarts
Revises: 0002_scheduler
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_job_restarts"
down_revision = "0002_scheduler"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sched_jobs") as batch:  # batch: SQLite alters by copying
        batch.add_column(
            sa.Column("restart_count", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("sched_jobs") as batch:
        batch.drop_column("restart_count")
