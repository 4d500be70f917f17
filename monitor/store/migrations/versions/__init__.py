"""Alembic revisions of infersight's schema (package data; alembic skips this file)."""
