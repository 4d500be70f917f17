"""Running the service's periodic work: the scheduler, leader election among replicas, and the
heap kept flat.

The service's periodic jobs on APScheduler 3's `BackgroundScheduler`.

Every job runs with `max_instances=1` and `coalesce=True`: a run that is due while the
previous one is still going is skipped (and counted in
`infersight_scheduler_job_skipped_total`), and runs missed while the process was busy
collapse into one, so a slow job never piles up. Leader-only jobs (rules, drift, outbox,
retention) first ask the `LeaderLock`; on a follower they return at once. A job's
exception is logged and counted, never fatal to the scheduler.

Leader election, so that only one replica evaluates rules (and runs drift, the outbox
and retention) against a shared database: two replicas never page twice.

- PostgreSQL: a session-level `pg_try_advisory_lock` held on a dedicated connection. The
  lock lives as long as that connection: a replica that dies (or loses its connection)
  releases it and another takes over at its next check.
- SQLite file: an exclusive `flock` on a file beside the database (replicas on one host).
- Otherwise (in-memory SQLite, election off): always the leader.

Keeping the service's resident memory flat under glibc.

The embedding model (PyTorch) allocates differently shaped buffers from several threads
at every batch; glibc's default of one malloc arena per thread (up to 8 per core) keeps
the freed memory of each arena, and RSS climbs for minutes (benchmarks/ingest.py;
docs/benchmarks/ingest.md). Capping the arenas at two and
handing free heap pages back after each embedding batch (`malloc_trim`) keeps it flat.
Both are no-ops where the C library is not glibc.

Keeping the cyclic garbage collector off what start-up built. Ingest allocates a few
objects per event, so the collector runs hundreds of times a second under load, and each
run of its oldest generation walks every object in the process: the libraries, the app,
the tables (millions with PyTorch imported). `freeze_heap` at the end of start-up moves
those into the permanent generation (`gc.freeze`) and `thaw_heap` at stop moves them back;
a large share of ingest's CPU per event was the collector's before (docs/benchmarks/ingest.md).
And a batch of 1,000 events parses into a few thousand dicts and records that all die once
the batch is written, so with CPython's youngest-generation threshold of 700 the collector
ran several times per batch and promoted the live half-parsed batch to older generations,
whose runs then walked it again (docs/benchmarks/ingest.md). `freeze_heap` also raises that threshold to 100,000 for the service's life (cyclic
garbage up to that many objects waits a little longer; everything else is freed by its
reference count as before), and `thaw_heap` puts it back."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import gc
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobExecutionEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from .metrics import ServiceMetrics

__all__ = [
    "AlwaysLeader",
    "FileLeaderLock",
    "JobSpec",
    "LeaderLock",
    "PostgresLeaderLock",
    "ServiceScheduler",
    "freeze_heap",
    "leader_lock_for",
    "limit_malloc_arenas",
    "new_replica_id",
    "thaw_heap",
    "trim_heap",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobSpec:
    name: str
    interval_s: float
    leader_only: bool


class ServiceScheduler:
    def __init__(
        self, metrics: ServiceMetrics, leader: LeaderLock | None = None, *, threads: int = 6
    ) -> None:
        self.metrics = metrics
        self.leader = leader or AlwaysLeader()
        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(threads)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone="UTC",
        )
        self._scheduler.add_listener(self._on_max_instances, EVENT_JOB_MAX_INSTANCES)
        self.jobs: dict[str, JobSpec] = {}

    def add(
        self, name: str, fn: Callable[[], object], interval_s: float, *, leader_only: bool = False,
        run_now: bool = False,
    ) -> None:  # fmt: skip
        if name in self.jobs:
            raise ValueError(f"job {name!r} is already scheduled")
        self.jobs[name] = JobSpec(name, interval_s, leader_only)
        kwargs = {"next_run_time": _now()} if run_now else {}
        self._scheduler.add_job(
            self._wrap(name, fn, leader_only),
            "interval",
            seconds=interval_s,
            id=name,
            name=name,
            max_instances=1,
            coalesce=True,
            **kwargs,
        )

    def run_now(self, name: str) -> None:
        """Schedule `name` to run at once (still never twice at a time)."""
        self._scheduler.modify_job(name, next_run_time=_now())

    def start(self) -> None:
        self._scheduler.start()

    def shutdown(self, wait: bool = True) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=wait)
        self.leader.release()

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    def _wrap(self, name: str, fn: Callable[[], object], leader_only: bool) -> Callable[[], None]:
        def run() -> None:
            if leader_only:
                leading = self.leader.is_leader()
                self.metrics.leader.set(1 if leading else 0)
                if not leading:
                    self.metrics.job_runs.labels(name, "follower").inc()
                    return
            t0 = time.perf_counter()
            try:
                fn()
            except Exception:
                log.exception("job %s failed", name)
                self.metrics.job_runs.labels(name, "error").inc()
            else:
                self.metrics.job_runs.labels(name, "ok").inc()
            finally:
                self.metrics.job_duration.labels(name).observe(time.perf_counter() - t0)

        return run

    def _on_max_instances(self, event: JobExecutionEvent) -> None:
        self.metrics.job_skipped.labels(event.job_id).inc()


def _now() -> object:
    import datetime as dt

    return dt.datetime.now(dt.UTC)


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


_M_ARENA_MAX = -8


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC = _glibc()


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas for threads created from now on; True when applied."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(_M_ARENA_MAX, arenas))


# A collection of the youngest generation every this many container allocations (net of
# frees) while the service runs; CPython's default is 700.
SERVICE_GC_THRESHOLD0 = 100_000


def freeze_heap() -> tuple[int, int, int]:
    """Leave everything allocated so far out of the garbage collector's future runs, and
    collect the youngest generation every `SERVICE_GC_THRESHOLD0` allocations rather than
    every 700. Returns the thresholds it replaced, for `thaw_heap`."""
    gc.collect()  # what start-up left as garbage goes now, not never
    gc.freeze()
    previous = gc.get_threshold()
    gc.set_threshold(SERVICE_GC_THRESHOLD0, previous[1], previous[2])
    return previous


def thaw_heap(threshold: tuple[int, int, int] | None = None) -> None:
    """Undo `freeze_heap`: the frozen objects back in the collector's care, and its
    thresholds as they were."""
    gc.unfreeze()
    if threshold is not None:
        gc.set_threshold(*threshold)


def trim_heap() -> None:
    """Return free heap memory to the operating system."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
