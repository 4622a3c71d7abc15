"""A stored key's own last use (``api_keys.last_used_at``).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``api_keys.last_used_at`` (empty: not used since the column came)."""
    op.add_column("api_keys", sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Drop ``api_keys.last_used_at``."""
    op.drop_column("api_keys", "last_used_at")
