"""requests.started_bucket: the time indexes keyed by a 10-second bucket of `started_at`

Calls reach the writer out of start order, so indexes on `started_at` took each batch's
rows all over their last seconds (most of ingest's write cost); keyed by the bucket, a batch
appends at one or two places (monitor/store/tables.py, `started_in`). Existing rows get
their bucket from the stored `started_at` (whole seconds // 10, as `time_bucket` computes
it); the two indexes on `started_at` are replaced by the same two on the bucket.

Revision ID: 0010_request_time_buckets
Revises: 0009_request_shape
Create Date: 2026-12-03 08:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_request_time_buckets"
down_revision: str | Sequence[str] | None = "0009_request_shape"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BUCKET_S = 10  # tables.BUCKET_S when this revision was written: a migration never changes with the code
_OLD = {"ix_requests_version_time": ["model_version", "started_at"], "ix_requests_started_at": ["started_at"]}
_NEW = {
    "ix_requests_version_bucket": ["model_version", "started_bucket"],
    "ix_requests_started_bucket": ["started_bucket"],
}


def upgrade() -> None:
    for name in _OLD:
        op.drop_index(name, table_name="requests")
    op.add_column("requests", sa.Column("started_bucket", sa.BigInteger(), nullable=True))
    if op.get_bind().dialect.name == "sqlite":
        # the text SQLAlchemy stores, 'YYYY-MM-DD HH:MM:SS.ffffff': its whole seconds, cut off
        # before SQLite's date functions see them (they round .9995 and up to the next second)
        op.execute(
            "UPDATE requests SET started_bucket ="
            f" CAST(strftime('%s', substr(started_at, 1, 19)) AS INTEGER) / {_BUCKET_S}"
        )
    else:
        op.execute(
            f"UPDATE requests SET started_bucket = floor(extract(epoch FROM started_at) / {_BUCKET_S})"
        )
    with op.batch_alter_table("requests") as batch:  # SQLite: NOT NULL by copying the table
        batch.alter_column("started_bucket", existing_type=sa.BigInteger(), nullable=False)
    for name, columns in _NEW.items():
        op.create_index(name, "requests", columns, unique=False)


def downgrade() -> None:
    for name in _NEW:
        op.drop_index(name, table_name="requests")
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("started_bucket")
    for name, columns in _OLD.items():
        op.create_index(name, "requests", columns, unique=False)
