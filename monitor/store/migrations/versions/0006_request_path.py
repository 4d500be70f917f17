"""requests.path: SLA routing's path (fast, standard) of each stored request

Revision ID: 0006_request_path
Revises: 0005_dataset
Create Date: 2026-12-01 13:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_request_path"
down_revision: str | Sequence[str] | None = "0005_dataset"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # nullable, no default: adding it rewrites no stored row on PostgreSQL or SQLite
    op.add_column("requests", sa.Column("path", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:  # SQLite cannot drop a column in place
        batch.drop_column("path")
