"""drift_reference_lengths: the token lengths of a reference's requests (request-length drift)

Revision ID: 0004_request_lengths
Revises: 0002
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_request_lengths"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "drift_reference_lengths",
        sa.Column("reference_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["reference_id"],
            ["drift_references.id"],
            name=op.f("fk_drift_reference_lengths_reference_id_drift_references"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("reference_id", "position", name=op.f("pk_drift_reference_lengths")),
    )


def downgrade() -> None:
    op.drop_table("drift_reference_lengths")
