"""Scheduler tables (filled in by the scheduler issue).

Revision ID: 0002_scheduler
Revises: 0001_brain
Create Date: 2026-11-21
"""

from __future__ import annotations

revision = "0002_scheduler"
down_revision = "0001_brain"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
