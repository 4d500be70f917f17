"""Storage: SQLAlchemy 2.x over SQLite (WAL) by default or PostgreSQL by URL.

`metadata` holds every table (all defined in `tables.py`); `upgrade(engine)` migrates a database with the bundled Alembic
revisions; `enforce_retention` deletes what the retention policy lets go.
"""

from __future__ import annotations

from infersight.monitor.extras import require_extra as _require_extra

_require_extra("infersight.monitor.store", "drift")  # one line when the extra is missing

from .database import (
    DatabaseUnavailable,
    MigrationFailed,
    SchemaTooNew,
    StoreError,
    connect,
    current_revision,
    head_revision,
    schema_diff,
    sqlite_url,
    upgrade,
)
from .retention import RetentionPolicy, RetentionResult, enforce_retention, prune_snapshot_files
from .tables import UTCDateTime, metadata

__all__ = [
    "DatabaseUnavailable",
    "MigrationFailed",
    "RetentionPolicy",
    "RetentionResult",
    "SchemaTooNew",
    "StoreError",
    "UTCDateTime",
    "connect",
    "current_revision",
    "enforce_retention",
    "head_revision",
    "metadata",
    "prune_snapshot_files",
    "schema_diff",
    "sqlite_url",
    "upgrade",
]
