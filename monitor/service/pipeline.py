"""The record pipeline: timing a call into an `InferenceRecord`, handing it to the observers,
the group-commit writer and the embedding reservoir.

Where every observed call goes: the SDK's batches (ingest), the upstream proxy and the
embedded runtime's OpenAI endpoints all hand `InferenceRecord`s to one `RecordPipeline`.

It queues the rows for the group-commit writer (raising `IngestOverloaded` before anything
else happens when the store is behind), lets each observer see each record (the live
statistics the alert engine and the page read), and offers the texts to the embedding
reservoir. An observer's exception is counted and swallowed: one bad observer never
loses a batch. Texts are offered under the label set the live statistics record them
under (`label_set`: `other` past the label value cap), so that the drift state kept per
model version stays as bounded as /metrics; the stored rows keep the names as sent.

Timing one served or proxied call and turning it into an `InferenceRecord`.

A bounded reservoir of texts awaiting embedding, so drift scoring never falls behind
silently: between two drains at most `capacity` texts are kept, a uniform random sample
of all offered (Vitter's algorithm R); the others are counted as skipped.

Group commit of observed requests into the `requests` table.

Callers hand over batches of records and get a `Future` that resolves once the rows are
committed. One writer thread takes everything queued, converts it to rows and inserts it
with one `executemany` in one transaction: under load many HTTP batches share one commit,
and no event ever costs a commit of its own. A duplicate `request_id` (an SDK retrying a
batch it already sent) is ignored, so delivery is idempotent. The queue is bounded in
rows: past the bound `submit` raises `IngestOverloaded` and nothing is accepted."""

from __future__ import annotations

import datetime as dt
import logging
import math
import operator
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from infersight.monitor.records import FINISH_REASONS, MAX_TEXT_CHARS, InferenceRecord, RecordSource
from infersight.monitor.store.tables import BUCKET_S, requests, time_bucket
from sqlalchemy import Engine, Insert, insert
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import SQLAlchemyError

from .errors import IngestOverloaded
from .metrics import ServiceMetrics

__all__ = [
    "CallTimer",
    "RecordObserver",
    "RecordPipeline",
    "RequestWriter",
    "SampledText",
    "TextReservoir",
    "make_record",
]

log = logging.getLogger(__name__)


class RecordObserver(Protocol):
    def observe(self, record: InferenceRecord) -> None: ...


class RecordPipeline:
    def __init__(
        self,
        writer: RequestWriter,
        metrics: ServiceMetrics,
        *,
        observers: Sequence[RecordObserver] = (),
        reservoir: TextReservoir | None = None,
    ) -> None:
        self.writer = writer
        self.metrics = metrics
        self.observers = list(observers)
        self.ledgers: list[RecordObserver] = []  # see every record, whatever `observe` says
        self.reservoir = reservoir
        self.label_set: Callable[[str, str], tuple[str, str]] | None = None

    def add_observer(self, observer: RecordObserver, *, every_record: bool = False) -> None:
        """`every_record`: also the calls the live statistics saw directly (SLO ledger, cost)."""
        (self.ledgers if every_record else self.observers).append(observer)

    def submit(self, records: Sequence[InferenceRecord], *, observe: bool = True) -> Future[int]:
        """Store, observe and offer `records`. `observe=False` when the live statistics
        already saw these calls (the embedded runtime's events feed them directly)."""
        future = self.writer.submit(records)  # may raise IngestOverloaded: nothing else happened
        for observer in [*(self.observers if observe else ()), *self.ledgers]:
            try:
                observe_many = getattr(observer, "observe_many", None)
                if observe_many is not None:  # the batch in one pass (the live statistics)
                    observe_many(records)
                else:
                    for record in records:
                        observer.observe(record)
            except Exception as exc:  # an observer must never lose the batch
                self.metrics.observer_errors.labels(type(observer).__name__).inc()
                log.warning("record observer %s failed: %s", type(observer).__name__, exc)
        if self.reservoir is not None:
            offered = 0
            for r in records:
                if r.prompt is not None or r.response is not None:
                    offered += 1
                    model, version = self._labels(r)
                    self.reservoir.offer(
                        SampledText(r.request_id, model, version, r.started_at, r.prompt, r.response)
                    )
            if offered:
                self.metrics.texts_offered.inc(offered)
        self.metrics.store_write_queue.set(self.writer.queued_rows)
        return future

    def submit_one(self, record: InferenceRecord, *, observe: bool = True) -> None:
        """Hand one observed call (served or proxied) over; a full store queue drops it,
        counted as `dropped`: the client's answer never waits on the store."""
        try:
            self.submit([record], observe=observe)
        except IngestOverloaded:
            self.metrics.ingest_events.labels("dropped").inc()

    def _labels(self, record: InferenceRecord) -> tuple[str, str]:
        if self.label_set is None:
            return record.model, record.model_version
        try:
            return self.label_set(record.model, record.model_version)
        except Exception:  # names the statistics refuse: offered as they are, like before
            return record.model, record.model_version


@dataclass
class CallTimer:
    """Wall-clock start, monotonic durations; `first()` at the first output token."""

    started_at: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)
    first_at: float | None = None
    end_at: float | None = None

    def first(self) -> None:
        if self.first_at is None:
            self.first_at = time.perf_counter()

    def finish(self) -> None:
        if self.end_at is None:
            self.end_at = time.perf_counter()

    @property
    def duration_s(self) -> float:
        return (self.end_at if self.end_at is not None else time.perf_counter()) - self.t0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_at is None else self.first_at - self.t0

    def tpot_s(self, output_tokens: int | None) -> float | None:
        if self.first_at is None or self.end_at is None or not output_tokens or output_tokens < 2:
            return None
        return (self.end_at - self.first_at) / (output_tokens - 1)


def make_record(
    *,
    request_id: str,
    model: str,
    model_version: str,
    timer: CallTimer,
    source: RecordSource,
    prompt_tokens: int | None = None,
    output_tokens: int | None = None,
    queue_s: float | None = None,
    error_type: str | None = None,
    prompt: str | None = None,
    response: str | None = None,
    text_sample_rate: float = 1.0,
    rng: random.Random | None = None,
    path: str | None = None,
    system_prompt: str | None = None,
    max_tokens: int | None = None,
    stream: bool | None = None,
    finish_reason: str | None = None,
) -> InferenceRecord:
    timer.finish()
    keep_text = text_sample_rate >= 1.0 or (rng or random).random() < text_sample_rate
    return InferenceRecord(
        request_id=request_id[:256],
        model=(model or "unknown")[:256],
        model_version=(model_version or "unknown")[:256],
        started_at=timer.started_at,
        duration_s=max(0.0, timer.duration_s),
        ttft_s=timer.ttft_s,
        tpot_s=timer.tpot_s(output_tokens),
        queue_s=queue_s,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        error_type=error_type[:256] if error_type else None,
        prompt=prompt[:MAX_TEXT_CHARS] if keep_text and prompt is not None else None,
        response=response[:MAX_TEXT_CHARS] if keep_text and response is not None else None,
        source=source,
        path=path,
        system_prompt=system_prompt[:MAX_TEXT_CHARS] if keep_text and system_prompt is not None else None,
        max_tokens=max_tokens if max_tokens is not None and 1 <= max_tokens < 2**31 else None,
        stream=stream,
        finish_reason=finish_reason if finish_reason is None or finish_reason in FINISH_REASONS else "other",
    )


@dataclass(frozen=True, slots=True)
class SampledText:
    request_id: str
    model: str
    model_version: str
    started_at: float
    prompt: str | None
    response: str | None


class TextReservoir:
    def __init__(
        self,
        capacity: int,
        *,
        on_skip: Callable[[int], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._items: list[SampledText] = []
        self._seen = 0  # offered since the last drain
        self._lock = threading.Lock()
        self._rng = rng or random.Random()
        self._on_skip = on_skip
        self.offered_total = 0
        self.skipped_total = 0

    def offer(self, item: SampledText) -> None:
        skipped = 0
        with self._lock:
            self._seen += 1
            self.offered_total += 1
            if len(self._items) < self.capacity:
                self._items.append(item)
            else:
                j = self._rng.randrange(self._seen)
                if j < self.capacity:
                    self._items[j] = item
                skipped = 1  # one text (the new one or the one it replaced) will not be embedded
                self.skipped_total += 1
        if skipped and self._on_skip is not None:
            self._on_skip(skipped)

    def drain(self) -> list[SampledText]:
        with self._lock:
            items, self._items, self._seen = self._items, [], 0
        return items

    def resize(self, capacity: int) -> None:
        """Keep at most `capacity` texts from now on (the embed job's budget, wiring_drift.py);
        texts already held beyond it are dropped at random, counted as skipped."""
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        dropped = 0
        with self._lock:
            if len(self._items) > capacity:
                dropped = len(self._items) - capacity
                self._items = self._rng.sample(self._items, capacity)
                self.skipped_total += dropped
            self.capacity = capacity
        if dropped and self._on_skip is not None:
            self._on_skip(dropped)

    def __len__(self) -> int:
        return len(self._items)


_MAX_ROWS_PER_COMMIT = 20_000
# The writer gathers what arrives this long after the first waiting row into one commit, and
# is woken once per such batch: woken per record (a GIL hand-off each) and committing one row
# at a time, a flood the service refuses cost the event loop a large share of its time
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


_COLUMNS = ("request_id", "model", "model_version", "started_at", "duration_s", "ttft_s", "tpot_s", "queue_s",
            "prompt_tokens", "output_tokens", "error_type", "prompt", "response", "source", "path",
            "system_prompt", "max_tokens", "stream", "finish_reason", "started_bucket")  # fmt: skip
_SQLITE_INSERT = (
    f"INSERT OR IGNORE INTO requests ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)})"
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
_SHORT_COLUMNS = tuple(c for c in _COLUMNS if c not in _OPTIONAL)
_SQLITE_INSERT_SHORT = (
    f"INSERT OR IGNORE INTO requests ({', '.join(_SHORT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in _SHORT_COLUMNS)})"
)
_FROMTS = dt.datetime.fromtimestamp
_STARTED_AT = operator.itemgetter(_COLUMNS.index("started_at"))  # a stable sort: duplicates keep their order
assert _SHORT_COLUMNS.index("started_at") == _COLUMNS.index("started_at")


def _values(r: InferenceRecord, started_at: Any, bucket: int) -> tuple[Any, ...]:
    """The row of `r` in `_COLUMNS` order, with `started_at` as the backend takes it and its
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
    (a batch's calls are a few seconds apart, in any order). Two lists: the rows in `_COLUMNS` order, and
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
# executed each row on its own, at several times the writer's and the server's CPU a row
# this way costs (docs/benchmarks/ingest.md).
_POSTGRES_STAGE = "infersight_requests_in"
_POSTGRES_CREATE_STAGE = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {_POSTGRES_STAGE} "
    "(LIKE requests INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
)
_POSTGRES_COPY = f"COPY {_POSTGRES_STAGE} ({', '.join(_COLUMNS)}) FROM STDIN"
_POSTGRES_INSERT = (
    f"INSERT INTO requests ({', '.join(_COLUMNS)}) SELECT {', '.join(_COLUMNS)} FROM {_POSTGRES_STAGE} "
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
                raise IngestOverloaded("the service is shutting down")
            if self._queued_rows + len(records) > self._max:
                raise IngestOverloaded(
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
                        [dict(zip(_COLUMNS, _postgres_rows([r])[0], strict=True)) for r in records],
                    )
        except self._write_errors as exc:
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
