"""Brain: Rubick's performance model per job or model key - the workload, the profiled runs
(a plan on resources and its measured iteration time) and the fitted 7 parameters of Eq. 1
(gearshift.brain.models.RubickWorkload, RubickRun, RubickFit).

Revision ID: 0007_rubick_models
Revises: 0006_layer_profiles
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_rubick_models"
down_revision = "0006_layer_profiles"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "brain_rubick_workloads",
        sa.Column("subject_kind", sa.String(8), nullable=False),
        sa.Column("subject", sa.String(128), nullable=False),
        sa.Column("workload", sa.JSON(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("stored_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("subject_kind", "subject", name="pk_brain_rubick_workloads"),
    )
    op.create_table(
        "brain_rubick_runs",
        sa.Column("subject_kind", sa.String(8), nullable=False),
        sa.Column("subject", sa.String(128), nullable=False),
        sa.Column("run_key", sa.String(256), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("iteration_ms", sa.Float(), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("stored_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("subject_kind", "subject", "run_key", name="pk_brain_rubick_runs"),
    )
    op.create_table(
        "brain_rubick_fits",
        sa.Column("subject_kind", sa.String(8), nullable=False),
        sa.Column("subject", sa.String(128), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("cluster", sa.JSON(), nullable=False),
        sa.Column("workload_digest", sa.String(64), nullable=False),
        sa.Column("rmsle", sa.Float(), nullable=False),
        sa.Column("run_count", sa.Integer(), nullable=False),
        sa.Column("runs_from_samples", sa.Integer(), nullable=False),
        sa.Column("offload_runs", sa.Integer(), nullable=False),
        sa.Column("fit_seconds", sa.Float(), nullable=False),
        sa.Column("fitted_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("subject_kind", "subject", name="pk_brain_rubick_fits"),
    )


def downgrade() -> None:
    op.drop_table("brain_rubick_fits")
    op.drop_table("brain_rubick_runs")
    op.drop_table("brain_rubick_workloads")
