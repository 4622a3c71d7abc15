"""Quota and budget counters of calendar windows, per period (``limit_usage``).

Revision ID: 0003
Revises: 0002_audit_log
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002_audit_log"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``limit_usage``."""
    op.create_table(
        "limit_usage",
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("period", sa.String(16), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=True),
        sa.Column("measure", sa.String(16), nullable=False),
        sa.Column("limit_window", sa.String(16), nullable=False),
        sa.Column("amount", sa.Double, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key_id", "period", name="pk_limit_usage"),
    )
    op.create_index("ix_limit_usage_period", "limit_usage", ["period"])


def downgrade() -> None:
    """Drop ``limit_usage``."""
    op.drop_index("ix_limit_usage_period", table_name="limit_usage")
    op.drop_table("limit_usage")
