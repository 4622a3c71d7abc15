"""The audit log: who changed what through the console or the Admin API, and when.

Revision ID: 0002_audit_log
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_audit_log"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``audit_log`` and its index on ``at`` (retention deletes by time)."""
    op.create_table(
        "audit_log",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("via", sa.String(32), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("replica", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])


def downgrade() -> None:
    """Drop ``audit_log``."""
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
