"""Scheduler: a parameter-server job's process plan and a user's pin, stored with the job.

The PS and worker counts and cores a PS job runs with come from the Brain's plans or
from `gearshift scale` (a pin, until `--auto`). Kept in memory only, a restarted
scheduler forgot both: it asked the Brain afresh, restarted a running job whose plan it
no longer knew, and dropped a user's pin. JSON written by gearshift.scheduler.ps_jobs
(`dump`); NULL for none (and for jobs written before these columns).

Revision ID: 0009_ps_plans
Revises: 0008_job_plan
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_ps_plans"
down_revision = "0008_job_plan"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sched_jobs") as batch:  # batch: SQLite alters by copying
        batch.add_column(sa.Column("ps_plan", sa.Text, nullable=True))
        batch.add_column(sa.Column("ps_pin", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sched_jobs") as batch:
        batch.drop_column("ps_pin")
        batch.drop_column("ps_plan")
