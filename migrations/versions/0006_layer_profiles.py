"""Brain: layer profiles (DeepPool), the burst-parallel planner's input, stored by key.

A profile is a model's layer graph with per-device-count fwd+bwd times, activation and
parameter bytes; `gearshift profile` stores it under the job spec's fingerprint and
`PlanBurstParallel` plans over it (gearshift.brain.models.LayerProfile).

Revision ID: 0006_layer_profiles
Revises: 0005_code_blobs
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_layer_profiles"
down_revision = "0005_code_blobs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "brain_layer_profiles",
        sa.Column("profile_key", sa.String(128), nullable=False),
        sa.Column("model_type", sa.String(128), nullable=False),
        sa.Column("device", sa.String(256), nullable=False),
        sa.Column("num_layers", sa.Integer(), nullable=False),
        sa.Column("global_batch", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("profile", sa.JSON(), nullable=False),
        sa.Column("stored_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("profile_key", name="pk_brain_layer_profiles"),
    )
    op.create_index("ix_brain_layer_profiles_model_type", "brain_layer_profiles", ["model_type"])


def downgrade() -> None:
    op.drop_index("ix_brain_layer_profiles_model_type", table_name="brain_layer_profiles")
    op.drop_table("brain_layer_profiles")
