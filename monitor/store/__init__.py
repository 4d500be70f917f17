"""Storage: SQLAlchemy 2.x over SQLite (WAL) by default or PostgreSQL by URL.

`metadata` holds every table (all defined in `tables.py`); `upgrade(engine)` migrates a database with the bundled Alembic
revisions; `enforce_retention` deletes what the retention policy lets go; `RequestWriter` group-commits
observed requests into the `requests` table (`writer.py`, with each dialect's SQL). The errors
under `StoreError`, the schema check and the column types stay in their modules.
"""

from __future__ import annotations

from infersight.monitor.extras import require_extra as _require_extra

_require_extra("infersight.monitor.store", "drift")  # one line when the extra is missing

from .database import StoreError, connect, current_revision, head_revision, sqlite_url, upgrade
from .retention import RetentionPolicy, enforce_retention
from .tables import metadata
from .writer import RequestWriter, WriteQueueFull

__all__ = [
    "RequestWriter",
    "RetentionPolicy",
    "StoreError",
    "WriteQueueFull",
    "connect",
    "current_revision",
    "enforce_retention",
    "head_revision",
    "metadata",
    "sqlite_url",
    "upgrade",
]
