"""Errors of the store.

StoreError
├── DatabaseUnavailable   the database cannot be reached or opened
├── SchemaTooNew          the database was migrated by a newer infersight
└── MigrationFailed       an Alembic revision failed (the transaction was rolled back)
"""

from __future__ import annotations

__all__ = ["DatabaseUnavailable", "MigrationFailed", "SchemaTooNew", "StoreError"]


class StoreError(Exception):
    """Base class of the store's errors."""


class DatabaseUnavailable(StoreError):
    """The database at the configured URL cannot be reached or opened."""


class SchemaTooNew(StoreError):
    """The database is at a revision this version of infersight does not know."""

    def __init__(self, revision: str) -> None:
        super().__init__(
            f"database schema is at revision {revision!r}, unknown to this infersight "
            "(was it upgraded by a newer version?)"
        )
        self.revision = revision


class MigrationFailed(StoreError):
    """A migration step failed; nothing was changed."""
