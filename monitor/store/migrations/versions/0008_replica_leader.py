"""replicas.leader: whether the replica held the leader lock at its last heartbeat

So that `GET /api/v1/replicas` and `infersight models replicas` can say which replica runs
the rules, drift, outbox and retention.

Revision ID: 0008_replica_leader
Revises: 0007_system_prompt
Create Date: 2026-12-02 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_replica_leader"
down_revision: str | Sequence[str] | None = "0007_system_prompt"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("replicas", sa.Column("leader", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("replicas") as batch:  # SQLite drops a column by copying the table
        batch.drop_column("leader")
