"""Scheduler: users' code packages, stored once by content hash.

A job that ships its own code names a package by SHA-256; the scheduler keeps the
package (a zip archive, size-capped) so that workers fetch it from the one service
they already talk to - no new server.

Revision ID: 0005_code_blobs
Revises: 0004_job_type_lock
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_code_blobs"
down_revision = "0004_job_type_lock"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sched_code_blobs",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("sched_code_blobs")
