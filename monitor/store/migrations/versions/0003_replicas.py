"""replicas: heartbeats and published statistics of each replica; per-replica action runs
and deploys; leased post-deploy analyses

Revision ID: 0003_replicas
Revises: 0004_request_lengths (chained after main's head)
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from infersight.monitor.store.tables import UTCDateTime

revision: str = "0003_replicas"
down_revision: str | Sequence[str] | None = "0004_request_lengths"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("heartbeat_at", UTCDateTime(), nullable=False),
        sa.Column("serving_version", sa.String(256)),
        sa.Column("waiting", sa.Text, nullable=False),
        sa.Column("resources", sa.Text, nullable=False),
    )
    op.create_table(
        "replica_slots",
        sa.Column("replica", sa.String(128), primary_key=True),
        sa.Column("model", sa.String(256), primary_key=True),
        sa.Column("model_version", sa.String(256), primary_key=True),
        sa.Column("slot", sa.Integer, primary_key=True),
        sa.Column("interval_s", sa.Float, nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("errors", sa.Integer, nullable=False),
        sa.Column("sketches", sa.Text, nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_replica_slots_slot", "replica_slots", ["slot"])
    with op.batch_alter_table("alert_action_runs") as batch:
        batch.add_column(sa.Column("replica", sa.String(128)))
    with op.batch_alter_table("deploys") as batch:
        batch.add_column(sa.Column("replica", sa.String(128)))
    with op.batch_alter_table("alert_deploy_analyses") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(64)))
        batch.add_column(sa.Column("lease_until", UTCDateTime()))


def downgrade() -> None:
    with op.batch_alter_table("alert_deploy_analyses") as batch:
        batch.drop_column("lease_until")
        batch.drop_column("lease_owner")
    with op.batch_alter_table("deploys") as batch:
        batch.drop_column("replica")
    with op.batch_alter_table("alert_action_runs") as batch:
        batch.drop_column("replica")
    op.drop_index("ix_replica_slots_slot", table_name="replica_slots")
    op.drop_table("replica_slots")
    op.drop_table("replicas")
