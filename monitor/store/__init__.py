"""Storage: SQLAlchemy 2.x over SQLite (WAL) by default or PostgreSQL by URL."""

from __future__ import annotations

from .database import connect, sqlite_url
from .metadata import UTCDateTime, metadata

__all__ = ["UTCDateTime", "connect", "metadata", "sqlite_url"]
