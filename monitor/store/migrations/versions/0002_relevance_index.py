"""requests: a partial index of the rows with a relevance score (the relevance alert's window)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 23:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WHERE = sa.text("relevance IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_requests_relevance_time",
        "requests",
        ["started_at", "model", "model_version", "relevance"],
        unique=False,
        sqlite_where=_WHERE,
        postgresql_where=_WHERE,
    )


def downgrade() -> None:
    op.drop_index("ix_requests_relevance_time", table_name="requests")
