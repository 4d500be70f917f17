"""Leader election, so that only one replica evaluates rules (and runs drift, the outbox
and retention) against a shared database: two replicas never page twice.

- PostgreSQL: a session-level `pg_try_advisory_lock` held on a dedicated connection. The
  lock lives as long as that connection: a replica that dies (or loses its connection)
  releases it and another takes over at its next check.
- SQLite file: an exclusive `flock` on a file beside the database (replicas on one host).
- Otherwise (in-memory SQLite, election off): always the leader.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import threading
import uuid
from pathlib import Path
from typing import Protocol

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

__all__ = [
    "AlwaysLeader",
    "FileLeaderLock",
    "LeaderLock",
    "PostgresLeaderLock",
    "leader_lock_for",
    "new_replica_id",
]

log = logging.getLogger(__name__)
RULES_LOCK_KEY = 0x1F5E_0002  # "infersight rule evaluation"


def new_replica_id() -> str:
    """This process among the replicas on one database: host, pid and a random part
    (unique even when a pid is reused after a restart)."""
    return f"{socket.gethostname()[:80]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class LeaderLock(Protocol):
    def is_leader(self) -> bool:
        """True while this process holds the lock; tries to take it when free."""
        ...

    def release(self) -> None: ...


class AlwaysLeader:
    def is_leader(self) -> bool:
        return True

    def release(self) -> None:
        pass


class PostgresLeaderLock:
    def __init__(self, engine: Engine, key: int = RULES_LOCK_KEY) -> None:
        self._engine = engine
        self._key = key
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    def is_leader(self) -> bool:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.exec_driver_sql("SELECT 1")
                    return True
                except SQLAlchemyError as exc:
                    log.warning("leader connection lost, leadership given up: %s", exc)
                    self._close()
            try:
                conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            except SQLAlchemyError as exc:
                log.warning("cannot reach the database for leader election: %s", exc)
                return False
            try:
                got = bool(conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({int(self._key)})").scalar())
            except SQLAlchemyError:
                conn.close()
                return False
            if got:
                self._conn = conn
                return True
            conn.close()
            return False

    def release(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(SQLAlchemyError):  # closing the connection releases it anyway
                    self._conn.exec_driver_sql(f"SELECT pg_advisory_unlock({int(self._key)})")
                self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()  # never back to the pool: the lock must die with it
                conn.close()
            except SQLAlchemyError:
                pass


class FileLeaderLock:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None
        self._lock = threading.Lock()

    def is_leader(self) -> bool:
        with self._lock:
            if self._fd is not None:
                return True
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return False
            self._fd = fd
            return True

    def release(self) -> None:
        with self._lock:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                self._fd = None


def leader_lock_for(engine: Engine, *, enabled: bool = True) -> LeaderLock:
    if not enabled:
        return AlwaysLeader()
    if engine.dialect.name == "postgresql":
        return PostgresLeaderLock(engine)
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database and database != ":memory:":
        return FileLeaderLock(Path(database).with_suffix(".leader.lock"))
    return AlwaysLeader()
