"""Opening the store: SQLite (WAL) in a data directory by default, PostgreSQL by URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event


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
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
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
