"""Group commit of observed requests into the `requests` table, with the SQL of each dialect.

Callers hand over batches of records and get a `Future` that resolves once the rows are
committed. One writer thread takes everything queued, converts it to rows and inserts it in
one transaction: under load many HTTP batches share one commit, and no event ever costs a
commit of its own. A duplicate `request_id` (an SDK retrying a batch it already sent) is
ignored, so delivery is idempotent. The queue is bounded in rows: past the bound `submit`
raises `WriteQueueFull` and nothing is accepted.

The rows are built as tuples straight from the records, without SQLAlchemy's per-value bind
processing: on SQLite two `executemany` INSERTs (rows with and without the optional fields),
on PostgreSQL (psycopg) a COPY into a session's staging table and one INSERT ... SELECT from
it, elsewhere SQLAlchemy's own insert. The column list is `tables.requests`' own, less the
columns the writer never fills (`_NOT_WRITTEN`); each column is the record's field of the
same name, and `started_bucket` is computed from `started_at`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import operator
import re
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from infersight.monitor.records import InferenceRecord
from sqlalchemy import Engine, Insert, insert
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import SQLAlchemyError

from .database import StoreError
from .tables import BUCKET_S, requests, time_bucket

__all__ = ["COLUMNS", "RequestWriter", "WriteQueueFull"]

log = logging.getLogger(__name__)


class WriteQueueFull(StoreError):
    """The writer holds as many rows as it may queue, or is closing; nothing of the batch was
    queued (the service answers 503 with Retry-After)."""


_MAX_ROWS_PER_COMMIT = 20_000
# The writer gathers what arrives this long after the first waiting row into one commit, and
# is woken once per such batch: woken per record (a GIL hand-off each) and committing one row
# at a time, a flood of small batches cost the event loop much of its time
# (docs/benchmarks/serving.md). Rows reach the database at most this much later.
_LINGER_S = 0.02
_WAKE_ROWS = 1_000  # this many waiting rows wake the writer at once
_UTC = dt.UTC


def _insert_ignoring_duplicates(engine: Engine) -> Insert:
    if engine.dialect.name == "postgresql":
        return postgresql.insert(requests).on_conflict_do_nothing(index_elements=["request_id"])
    if engine.dialect.name == "sqlite":
        return insert(requests).prefix_with("OR IGNORE")
    return insert(requests)


def _text(value: str | None) -> str | None:
    # PostgreSQL text cannot hold NUL; keep the rest of the string on every backend alike
    return value.replace("\x00", "\ufffd") if value is not None and "\x00" in value else value


_SURROGATE = re.compile("[\ud800-\udfff]")
_TEXT_FIELDS = tuple(f.name for f in dataclasses.fields(InferenceRecord) if "str" in str(f.type))


def _without_surrogates(records: Sequence[InferenceRecord]) -> list[InferenceRecord] | None:
    """The records with every lone surrogate replaced (no encoding can store one), or None when
    none has one. Only a failed write looks: checking every text up front would cost each row."""
    cleaned, changed = [], False
    for r in records:
        fields: dict[str, Any] = {
            name: _SURROGATE.sub("\ufffd", value)
            for name in _TEXT_FIELDS
            if isinstance(value := getattr(r, name), str) and _SURROGATE.search(value)
        }
        if fields:
            changed = True
            r = dataclasses.replace(r, **fields)
        cleaned.append(r)
    return cleaned if changed else None


# what the database fills (`id`) or the drift module sets later (`relevance`)
_NOT_WRITTEN = frozenset({"id", "relevance"})
COLUMNS: tuple[str, ...] = tuple(c.name for c in requests.columns if c.name not in _NOT_WRITTEN)
# The rows below are tuples written out in this order (a call per value would cost more than
# the row): the record's fields in the table's order, then the bucket
# (tests/test_ingest_batches.py holds every written column to the record's field of its name).
_SQLITE_INSERT = (
    f"INSERT OR IGNORE INTO requests ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"
)
# Most calls carry none of these. The sqlite3 module binds None through its adapter lookup
# (two failed attribute lookups a value), which made binding eight of them most of a row's
# binding cost: such rows go through an INSERT without them (SQLite stores NULL).
_OPTIONAL = (
    "error_type",
    "prompt",
    "response",
    "path",
    "system_prompt",
    "max_tokens",
    "stream",
    "finish_reason",
)
_SHORT_COLUMNS = tuple(c for c in COLUMNS if c not in _OPTIONAL)
_SQLITE_INSERT_SHORT = (
    f"INSERT OR IGNORE INTO requests ({', '.join(_SHORT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in _SHORT_COLUMNS)})"
)
_FROMTS = dt.datetime.fromtimestamp
_STARTED_AT = operator.itemgetter(COLUMNS.index("started_at"))  # a stable sort: duplicates keep their order
assert _SHORT_COLUMNS.index("started_at") == COLUMNS.index("started_at")


def _values(r: InferenceRecord, started_at: Any, bucket: int) -> tuple[Any, ...]:
    """The row of `r` in `COLUMNS` order, with `started_at` as the backend takes it and its
    `started_bucket`."""
    rid, model, version, error, prompt, response, path, system = (
        r.request_id, r.model, r.model_version, r.error_type, r.prompt, r.response, r.path, r.system_prompt,
    )  # fmt: skip
    if (  # NUL anywhere: rare, so checked inline first and replaced field by field after
        "\x00" in rid or "\x00" in model or "\x00" in version
        or (error is not None and "\x00" in error) or (prompt is not None and "\x00" in prompt)
        or (response is not None and "\x00" in response) or (path is not None and "\x00" in path)
        or (system is not None and "\x00" in system)
    ):  # fmt: skip
        return (_text(rid), _text(model), _text(version), started_at, r.duration_s, r.ttft_s, r.tpot_s,
                r.queue_s, r.prompt_tokens, r.output_tokens, _text(error), _text(prompt), _text(response),
                r.source, _text(path), _text(system), r.max_tokens, r.stream, r.finish_reason, bucket)  # fmt: skip
    return (rid, model, version, started_at, r.duration_s, r.ttft_s, r.tpot_s, r.queue_s, r.prompt_tokens,
            r.output_tokens, error, prompt, response, r.source, path, system, r.max_tokens, r.stream,
            r.finish_reason, bucket)  # fmt: skip


def _stored_time(started_at: float) -> tuple[int, int]:
    """The whole seconds and microseconds `started_at` is stored as: rounded as `datetime`
    rounds them (half to even, carried into the seconds), so that the bucket made from the
    seconds is the one `time_bucket` gives for the stored value."""
    fraction, whole = math.modf(started_at)
    us = round(fraction * 1e6)
    second = int(whole)
    if us >= 1_000_000:
        second += 1
        us -= 1_000_000
    return second, us


def _sqlite_rows(records: Sequence[InferenceRecord]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The rows for SQLite, `started_at` as the text SQLAlchemy's SQLite DateTime stores
    (naive UTC, microseconds), made directly: the hot path skips the per-value bind
    processing of the ORM layer. The whole seconds are formatted once per distinct second
    (a batch's calls are a few seconds apart, in any order). Two lists: the rows in `COLUMNS` order, and
    those of the records without any `_OPTIONAL` field in `_SHORT_COLUMNS` order."""
    rows, short = [], []
    prefixes: dict[int, str] = {}
    for r in records:
        second, us = _stored_time(r.started_at)
        prefix = prefixes.get(second)
        if prefix is None:
            prefix = prefixes[second] = _FROMTS(second, _UTC).strftime("%Y-%m-%d %H:%M:%S")
        rid, model, version = r.request_id, r.model, r.model_version
        if (
            r.error_type is None and r.prompt is None and r.response is None and r.path is None
            and r.system_prompt is None and r.max_tokens is None and r.stream is None and r.finish_reason is None
            and "\x00" not in rid and "\x00" not in model and "\x00" not in version
        ):  # fmt: skip
            short.append((rid, model, version, f"{prefix}.{us:06d}", r.duration_s, r.ttft_s, r.tpot_s, r.queue_s,
                          r.prompt_tokens, r.output_tokens, r.source, second // BUCKET_S))  # fmt: skip
        else:
            rows.append(_values(r, f"{prefix}.{us:06d}", second // BUCKET_S))
    return rows, short


# PostgreSQL: the rows are COPYed into a temporary table of the session, then inserted from
# it in one statement that skips duplicates. psycopg's pipelined `executemany` bound and
# executed each row on its own, which cost the writer and the server about twice as much CPU
# a row (docs/benchmarks/ingest.md).
_POSTGRES_STAGE = "infersight_requests_in"
_POSTGRES_CREATE_STAGE = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {_POSTGRES_STAGE} "
    "(LIKE requests INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
)
_POSTGRES_COPY = f"COPY {_POSTGRES_STAGE} ({', '.join(COLUMNS)}) FROM STDIN"
_POSTGRES_INSERT = (
    f"INSERT INTO requests ({', '.join(COLUMNS)}) SELECT {', '.join(COLUMNS)} FROM {_POSTGRES_STAGE} "
    "ON CONFLICT (request_id) DO NOTHING"
)


def _copy_postgres(conn: Any, rows: Sequence[tuple[Any, ...]]) -> None:
    """`rows` into `requests` over `conn` (a SQLAlchemy connection on psycopg, in a
    transaction), through the session's staging table (made once per database session)."""
    session = conn.connection  # the pooled DB-API connection: `info` lives as long as it does
    cursor = session.driver_connection.cursor()
    try:
        if not session.info.get(_POSTGRES_STAGE):
            cursor.execute(_POSTGRES_CREATE_STAGE)
            session.info[_POSTGRES_STAGE] = True
        with cursor.copy(_POSTGRES_COPY) as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(_POSTGRES_INSERT)
    except Exception:
        # the rollback that follows also undoes a CREATE made in this transaction
        session.info.pop(_POSTGRES_STAGE, None)
        raise


def _postgres_rows(records: Sequence[InferenceRecord]) -> list[tuple[Any, ...]]:
    """The rows for psycopg's `executemany` (pipelined), `started_at` an aware UTC datetime
    (what `UTCDateTime` binds), without SQLAlchemy's per-value bind processing."""
    rows = []
    for r in records:
        at = _FROMTS(r.started_at, _UTC)
        rows.append(_values(r, at, time_bucket(at)))
    return rows


class RequestWriter:
    """The group-commit writer of `engine`'s `requests` table (a thread of its own, started
    here; `close()` writes what is queued and stops it). `on_written(n)` after each commit,
    `on_error(exc)` after each failed write."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_queued_rows: int = 200_000,
        on_written: Callable[[int], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self._engine = engine
        self._stmt = _insert_ignoring_duplicates(engine)
        self._sqlite = engine.dialect.name == "sqlite"
        self._postgres = engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
        # what a failed write raises; psycopg's own errors through the COPY path, which
        # SQLAlchemy does not wrap
        self._write_errors: tuple[type[Exception], ...] = (
            SQLAlchemyError,
            ValueError,
            OverflowError,
            OSError,
        )
        if self._postgres:
            import psycopg

            self._write_errors += (psycopg.Error,)
        self._max = max_queued_rows
        self._queue: deque[tuple[Sequence[InferenceRecord], Future[int]]] = deque()
        self._queued_rows = 0
        self._cond = threading.Condition()
        self._closed = False
        self._on_written = on_written
        self._on_error = on_error
        self._thread = threading.Thread(target=self._run, name="infersight-request-writer", daemon=True)
        self._thread.start()

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def submit(self, records: Sequence[InferenceRecord]) -> Future[int]:
        """Queue `records`; the future gives the number of rows handed to the database."""
        future: Future[int] = Future()
        if not records:
            future.set_result(0)
            return future
        with self._cond:
            if self._closed:
                raise WriteQueueFull("the service is shutting down")
            if self._queued_rows + len(records) > self._max:
                raise WriteQueueFull(
                    f"{self._queued_rows} rows are waiting to be written (limit {self._max}); retry later"
                )
            self._queue.append((records, future))
            self._queued_rows += len(records)
            if len(self._queue) == 1 or self._queued_rows >= _WAKE_ROWS:
                self._cond.notify()  # the first of a batch, or a batch worth writing now
        return future

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until everything queued so far is written; False on timeout."""
        marker = self.submit_marker()
        try:
            marker.result(timeout)
            return True
        except TimeoutError:
            return False

    def submit_marker(self) -> Future[int]:
        future: Future[int] = Future()
        with self._cond:
            self._queue.append(((), future))
            self._cond.notify()
        return future

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _take(self) -> list[tuple[Sequence[InferenceRecord], Future[int]]]:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._queued_rows < _WAKE_ROWS and not self._closed and self._queue[-1][0]:
                self._cond.wait(_LINGER_S)  # gather the rows that follow (a flush marker: at once)
            taken: list[tuple[Sequence[InferenceRecord], Future[int]]] = []
            n = 0
            while self._queue and (not taken or n + len(self._queue[0][0]) <= _MAX_ROWS_PER_COMMIT):
                records, future = self._queue.popleft()
                taken.append((records, future))
                n += len(records)
            return taken

    def _run(self) -> None:
        while True:
            taken = self._take()
            if not taken:
                return  # closed and drained
            n = sum(len(records) for records, _ in taken)
            error = self._write([r for records, _ in taken for r in records])
            if error is not None and len(taken) > 1:
                # one submission must not fail the others of its group: retry each alone
                for records, future in taken:
                    self._settle(future, len(records), self._write(records))
            else:
                for records, future in taken:
                    self._settle(future, len(records), error)
            with self._cond:
                self._queued_rows -= n

    def _write(self, records: Sequence[InferenceRecord]) -> Exception | None:
        error = self._write_once(records)
        if error is not None and (cleaned := _without_surrogates(records)) is not None:
            # a lone surrogate (text from a client or an upstream that JSON let through) cannot
            # be encoded for the database: it must not fail the rows written beside it
            error = self._write_once(cleaned)
        if error is not None:
            log.warning("writing %d requests failed: %s", len(records), error)
            if self._on_error is not None:
                self._on_error(error)
        elif self._on_written is not None:
            self._on_written(len(records))
        return error

    def _write_once(self, records: Sequence[InferenceRecord]) -> Exception | None:
        if not records:
            return None
        try:
            if self._sqlite:
                rows, short = _sqlite_rows(records)
                rows.sort(key=_STARTED_AT)  # rows in start order: a window reads neighbouring pages
                short.sort(key=_STARTED_AT)  # (the same position in both orders)
                with self._engine.begin() as conn:  # a duplicate with optional fields wins over one without
                    if rows:
                        conn.exec_driver_sql(_SQLITE_INSERT, rows)
                    if short:
                        conn.exec_driver_sql(_SQLITE_INSERT_SHORT, short)
            elif self._postgres:
                rows = _postgres_rows(records)
                rows.sort(key=_STARTED_AT)
                with self._engine.begin() as conn:
                    _copy_postgres(conn, rows)
            else:
                with self._engine.begin() as conn:
                    conn.execute(
                        self._stmt,
                        [dict(zip(COLUMNS, _postgres_rows([r])[0], strict=True)) for r in records],
                    )
        except self._write_errors as exc:
            return exc
        return None

    @staticmethod
    def _settle(future: Future[int], n: int, error: Exception | None) -> None:
        if error is None:
            future.set_result(n)
        else:
            future.set_exception(error)
