"""The usage ledger, stored API keys and the shared-state version counters.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``usage``, ``api_keys`` and ``store_versions`` (with the keys counter at 0)."""
    op.create_table(
        "usage",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("request_id", sa.Text, nullable=False),
        sa.Column("user_name", sa.Text, nullable=False),
        sa.Column("team", sa.Text, nullable=True),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("backend", sa.Text, nullable=False),
        sa.Column("tier", sa.Text, nullable=False),
        sa.Column("input_tokens", sa.BigInteger, nullable=False),
        sa.Column("output_tokens", sa.BigInteger, nullable=False),
        sa.Column("cost", sa.Double, nullable=True),
        sa.Column("queue_seconds", sa.Double, nullable=True),
        sa.Column("ttft_seconds", sa.Double, nullable=True),
        sa.Column("outcome", sa.String(64), nullable=False),
        sa.Column("replica", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_usage"),
    )
    op.create_index("ix_usage_ended_at", "usage", ["ended_at"])
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("user_name", sa.Text, nullable=False),
        sa.Column("team", sa.Text, nullable=True),
        sa.Column("tiers", sa.JSON, nullable=False),
        sa.Column("admin", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("replaces", sa.String(32), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.UniqueConstraint("sha256", name="uq_api_keys_sha256"),
    )
    versions = op.create_table(
        "store_versions",
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_store_versions"),
    )
    op.bulk_insert(versions, [{"name": "keys", "version": 0}])


def downgrade() -> None:
    """Drop the three tables."""
    op.drop_table("store_versions")
    op.drop_table("api_keys")
    op.drop_index("ix_usage_ended_at", table_name="usage")
    op.drop_table("usage")
