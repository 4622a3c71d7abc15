"""Team weights, quotas and budgets managed live (``teams``, ``entitlement_limits``).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``teams`` and ``entitlement_limits``, and their version counter at 0."""
    op.create_table(
        "teams",
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("weight", sa.Double, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_teams"),
    )
    op.create_table(
        "entitlement_limits",
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("tokens_per_minute", sa.BigInteger, nullable=True),
        sa.Column("tokens_per_day", sa.BigInteger, nullable=True),
        sa.Column("requests_per_minute", sa.BigInteger, nullable=True),
        sa.Column("per_day", sa.Double, nullable=True),
        sa.Column("per_month", sa.Double, nullable=True),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("kind", "scope", "subject", "model", name="pk_entitlement_limits"),
    )
    versions = sa.table("store_versions", sa.column("name"), sa.column("version"))
    op.bulk_insert(versions, [{"name": "entitlement", "version": 0}])


def downgrade() -> None:
    """Drop both tables and their counter."""
    op.execute("DELETE FROM store_versions WHERE name = 'entitlement'")
    op.drop_table("entitlement_limits")
    op.drop_table("teams")
