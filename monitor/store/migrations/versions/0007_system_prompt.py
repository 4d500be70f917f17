"""requests.system_prompt: what a chat request put before its question (its system messages),
and dataset_items.system_prompt, its copy in what the collect action keeps

Kept so that the prefix cache's preload renders recorded chats as they were sent: a system
prompt shared by many requests is then one frequent prefix, prefilled at start and at deploy.

Revision ID: 0007_system_prompt
Revises: 0006_request_path
Create Date: 2026-12-01 13:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_system_prompt"
down_revision: str | Sequence[str] | None = "0006_request_path"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
_TABLES = ("requests", "dataset_items")


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(table, sa.Column("system_prompt", sa.Text(), nullable=True))


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:  # SQLite drops a column by copying the table
            batch.drop_column("system_prompt")
