"""feedback and environments: users' feedback by request id, and the software each start ran on

`feedback` is apart from `requests` (a request's record is never altered; feedback may
arrive before its request). `environments` holds the versions recorded at each start and
deploy, which the slowdown diagnosis compares across windows.

Revision ID: 0011_feedback_environment
Revises: 0010_request_time_buckets
Create Date: 2026-12-04 22:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from infersight.monitor.store.tables import UTCDateTime

revision: str = "0011_feedback_environment"
down_revision: str | Sequence[str] | None = "0010_request_time_buckets"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "feedback",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(length=256), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("given", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=True),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("user", sa.String(length=256), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feedback")),
    )
    op.create_index("ix_feedback_request_id", "feedback", ["request_id"], unique=False)
    op.create_index("ix_feedback_received_at", "feedback", ["received_at"], unique=False)
    op.create_table(
        "environments",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("taken_at", UTCDateTime(), nullable=False),
        sa.Column("reason", sa.String(length=16), nullable=False),
        sa.Column("replica", sa.String(length=128), nullable=True),
        sa.Column("versions", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environments")),
    )
    op.create_index("ix_environments_taken_at", "environments", ["taken_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_environments_taken_at", table_name="environments")
    op.drop_table("environments")
    op.drop_index("ix_feedback_received_at", table_name="feedback")
    op.drop_index("ix_feedback_request_id", table_name="feedback")
    op.drop_table("feedback")
