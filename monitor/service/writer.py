"""Group commit of observed requests into the `requests` table.

Callers hand over batches of records and get a `Future` that resolves once the rows are
committed. One writer thread takes everything queued, converts it to rows and inserts it
with one `executemany` in one transaction: under load many HTTP batches share one commit,
and no event ever costs a commit of its own. A duplicate `request_id` (an SDK retrying a
batch it already sent) is ignored, so delivery is idempotent. The queue is bounded in
rows: past the bound `submit` raises `IngestOverloaded` and nothing is accepted.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from infersight.monitor.records import InferenceRecord
from infersight.monitor.store.tables import requests
from sqlalchemy import Engine, Insert, insert
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import SQLAlchemyError

from .errors import IngestOverloaded

__all__ = ["RequestWriter"]

log = logging.getLogger(__name__)
_MAX_ROWS_PER_COMMIT = 20_000
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


_COLUMNS = ("request_id", "model", "model_version", "started_at", "duration_s", "ttft_s", "tpot_s", "queue_s",
            "prompt_tokens", "output_tokens", "error_type", "prompt", "response", "source", "path",
            "system_prompt")  # fmt: skip
_SQLITE_INSERT = (
    f"INSERT OR IGNORE INTO requests ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)})"
)
_FROMTS = dt.datetime.fromtimestamp


def _values(r: InferenceRecord, started_at: Any) -> tuple[Any, ...]:
    """The row of `r` in `_COLUMNS` order, with `started_at` as the backend takes it."""
    return (_text(r.request_id), _text(r.model), _text(r.model_version), started_at, r.duration_s, r.ttft_s,
            r.tpot_s, r.queue_s, r.prompt_tokens, r.output_tokens, _text(r.error_type), _text(r.prompt),
            _text(r.response), r.source, _text(r.path), _text(r.system_prompt))  # fmt: skip


def _sqlite_row(r: InferenceRecord) -> tuple[Any, ...]:
    # the text SQLAlchemy's SQLite DateTime stores (naive UTC, microseconds), made directly:
    # the hot path skips the per-value bind processing of the ORM layer
    return _values(r, _FROMTS(r.started_at, _UTC).strftime("%Y-%m-%d %H:%M:%S.%f"))


def _row(r: InferenceRecord) -> dict[str, Any]:
    return dict(zip(_COLUMNS, _values(r, _FROMTS(r.started_at, _UTC)), strict=True))


class RequestWriter:
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
                raise IngestOverloaded("the service is shutting down")
            if self._queued_rows + len(records) > self._max:
                raise IngestOverloaded(
                    f"{self._queued_rows} rows are waiting to be written (limit {self._max}); retry later"
                )
            self._queue.append((records, future))
            self._queued_rows += len(records)
            self._cond.notify()
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
        if not records:
            return None
        try:
            if self._sqlite:
                tuples = [_sqlite_row(r) for r in records]
                with self._engine.begin() as conn:
                    conn.exec_driver_sql(_SQLITE_INSERT, tuples)
            else:
                rows = [_row(r) for r in records]
                with self._engine.begin() as conn:
                    conn.execute(self._stmt, rows)
        except (SQLAlchemyError, ValueError, OverflowError, OSError) as exc:
            log.warning("writing %d requests failed: %s", len(records), exc)
            if self._on_error is not None:
                self._on_error(exc)
            return exc
        if self._on_written is not None:
            self._on_written(len(records))
        return None

    @staticmethod
    def _settle(future: Future[int], n: int, error: Exception | None) -> None:
        if error is None:
            future.set_result(n)
        else:
            future.set_exception(error)
