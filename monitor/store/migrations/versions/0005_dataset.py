"""dataset_collections and dataset_items: requests kept by the collect action for export

Revision ID: 0005_dataset
Revises: 0003_replicas
Create Date: 2026-12-01 10:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from infersight.monitor.store.tables import UTCDateTime

revision: str = "0005_dataset"
down_revision: str | Sequence[str] | None = "0003_replicas"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dataset_collections",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("collection_id", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("model_version", sa.String(256)),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("collected", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("done_at", UTCDateTime()),
    )
    op.create_index("ix_dataset_collections_created_at", "dataset_collections", ["created_at"])
    op.create_table(
        "dataset_items",
        sa.Column(
            "collection_id",
            sa.String(64),
            sa.ForeignKey("dataset_collections.collection_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("request_id", sa.String(256), primary_key=True),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("model_version", sa.String(256), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("ttft_s", sa.Float()),
        sa.Column("prompt_tokens", sa.Integer()),
        sa.Column("output_tokens", sa.Integer()),
        sa.Column("error_type", sa.String(256)),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("response", sa.Text()),
        sa.Column("relevance", sa.Float()),
    )
    op.create_index("ix_dataset_items_version_time", "dataset_items", ["model_version", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_dataset_items_version_time", table_name="dataset_items")
    op.drop_table("dataset_items")
    op.drop_index("ix_dataset_collections_created_at", table_name="dataset_collections")
    op.drop_table("dataset_collections")
