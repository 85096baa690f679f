"""Brain tables (filled in by the Brain issue).

Revision ID: 0001_brain
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

revision = "0001_brain"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
