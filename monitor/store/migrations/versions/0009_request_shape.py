"""requests.max_tokens, requests.stream, requests.finish_reason: each request's shape

What the client asked (its output budget, streamed or not) and why the generation ended,
so that the release checks compare requests of the same shape (alerts/release/strata.py):
a client changing `max_tokens` or streaming at deploy time then cannot make a difference.

Revision ID: 0009_request_shape
Revises: 0008_replica_leader
Create Date: 2026-12-02 14:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_request_shape"
down_revision: str | Sequence[str] | None = "0008_replica_leader"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
_COLUMNS = ("max_tokens", "stream", "finish_reason")


def upgrade() -> None:
    op.add_column("requests", sa.Column("max_tokens", sa.Integer(), nullable=True))
    op.add_column("requests", sa.Column("stream", sa.Boolean(), nullable=True))
    op.add_column("requests", sa.Column("finish_reason", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:  # SQLite drops a column by copying the table
        for name in reversed(_COLUMNS):
            batch.drop_column(name)
