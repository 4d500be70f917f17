"""Opening the store: SQLite (WAL) in a data directory by default, PostgreSQL by URL.

Schema migrations, run programmatically (`infersight serve` upgrades on start).

Two processes starting together against one PostgreSQL serialise on an advisory lock;
on SQLite the database file is locked by `BEGIN IMMEDIATE`-style exclusive access
through a lock file beside it.

The errors of the store:

StoreError
├── DatabaseUnavailable   the database cannot be reached or opened
├── SchemaTooNew          the database was migrated by a newer infersight
└── MigrationFailed       an Alembic revision failed (the transaction was rolled back)
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import SQLAlchemyError

__all__ = [
    "DatabaseUnavailable",
    "MigrationFailed",
    "SchemaTooNew",
    "StoreError",
    "current_revision",
    "head_revision",
    "schema_diff",
    "upgrade",
]


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


def sqlite_url(data_dir: str | Path) -> str:
    path = Path(data_dir).expanduser().resolve() / "infersight.sqlite"
    return f"sqlite:///{path}"


def connect(url: str, **engine_kwargs: Any) -> Engine:
    """An `Engine` for `url`. SQLite gets WAL, foreign keys and a busy timeout;
    `postgresql://` URLs use psycopg 3."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("sqlite"):
        if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
            _private_sqlite_files(Path(url.removeprefix("sqlite:///").partition("?")[0]))
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, **engine_kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, **engine_kwargs)


def _private_sqlite_files(path: Path) -> None:
    """The database holds users' prompts and answers: its folder is made 0700 when created
    here, and the file is created 0600 before SQLite opens it, so the `-wal` and `-shm`
    files SQLite creates take the same mode. Files left more open by an older version are
    narrowed to 0600."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if p.stat().st_mode & 0o077:
                p.chmod(0o600)
        except OSError:  # absent, or not ours to change: SQLite reports what matters
            pass


_MIGRATION_LOCK_KEY = 0x1F5E_0001  # pg advisory lock id for "infersight migrations"


def _config(connection: Connection | None = None, script_location: str | Path | None = None) -> Config:
    cfg = Config()
    location = script_location or str(resources.files("infersight.monitor.store.migrations"))
    cfg.set_main_option("script_location", str(location))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision(script_location: str | Path | None = None) -> str:
    head = ScriptDirectory.from_config(_config(script_location=script_location)).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, None for an empty database."""
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as exc:
        raise DatabaseUnavailable(f"cannot open {engine.url.render_as_string()}: {exc}") from exc


def upgrade(engine: Engine, *, revision: str = "head", script_location: str | Path | None = None) -> str:
    """Migrate the database to `revision` (default: the newest) and return the revision
    it is at. Idempotent; rows are kept (SQLite tables are altered by copy-and-move)."""
    cfg = _config(script_location=script_location)
    known = {s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()}
    with _migration_lock(engine):
        current = current_revision(engine)
        if current is not None and current not in known:
            raise SchemaTooNew(current)
        try:
            with engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK_KEY})")
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
        except SQLAlchemyError as exc:
            raise MigrationFailed(f"upgrade to {revision} failed: {exc}") from exc
    after = current_revision(engine)
    assert after is not None
    return after


def schema_diff(engine: Engine) -> list[Any]:
    """Differences between the database and the code's metadata (empty when in step)."""
    from .tables import metadata

    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(ctx, metadata))


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        yield
        return
    path = Path(database).with_suffix(".migrate.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
