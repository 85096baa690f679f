"""Scheduler: the resource plan a job's placement runs, and a user's pin, stored with the job.

A data-parallel job's per-process resources (`process_plan`) and a parameter-server job's
PS and worker counts and cores (`ps_plan`) come from the Brain's plans; a PS job's may be
pinned by `gearshift scale` until `--auto` (`ps_pin`). Kept in memory only, a restarted
scheduler forgot them: it planned running jobs afresh (and could restart one whose plan
it no longer knew) and dropped a user's pin. JSON written by
gearshift.scheduler.plugins.dlrover.plan_book (`dump`); NULL for none (and for jobs written before
these
columns).

Revision ID: 0009_stored_plans
Revises: 0008_job_plan
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_stored_plans"
down_revision = "0008_job_plan"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sched_jobs") as batch:  # batch: SQLite alters by copying
        batch.add_column(sa.Column("process_plan", sa.Text, nullable=True))
        batch.add_column(sa.Column("ps_plan", sa.Text, nullable=True))
        batch.add_column(sa.Column("ps_pin", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sched_jobs") as batch:
        batch.drop_column("ps_pin")
        batch.drop_column("ps_plan")
        batch.drop_column("process_plan")
