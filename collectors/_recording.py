"""Recording without locks: the hot-path handle of one label set, and the folding of what it
collected into histograms and sliding-window sketches.

The way OpenTelemetry's SDK and Prometheus' native histograms go: the caller only appends
a raw observation to a buffer, and the buffers are merged into the aggregates later, when
`/metrics` is scraped, a query is answered, or (so that memory stays bounded when nobody
asks) by the caller whose observation fills a buffer. No lock is taken on the hot path:
`list.append` is atomic, and the drain takes a prefix of the list with two atomic list
operations (a slice, then deleting that slice), so an append that lands between them stays
for the next drain; nothing is lost and nothing is folded twice. The drains themselves run
under the owning `InferenceStats`' fold lock.

Four buffers, by what the observation carries:
- `timed`: `start, end` of a call that `enter()`ed and finished without an error or
  anything else to say (the SDK decorator's plain calls and coroutines), flat: two floats
  added by one `extend`, so the list's length is always even;
- `streamed`: `start, first item, end, items` (floats, items >= 1) of a stream that
  `enter()`ed and ended without an error (the decorator's generators), flat, four floats
  by one `extend`; durations, TTFT and TPOT are computed when folded, as arrays;
- `finished`: a full `Pending` tuple of a call that `enter()`ed;
- `added`: full tuples that never entered (ingest, the manual API), not counted as leaving.

In flight = entered - (folded exits + exits still buffered) - left without an observation.

The hot path of the decorator: `n = series.entered.incr()` at the start, then
`series.timed.extend((start, end))`, and a fold when `n & series.fold_mask == fold_mask`
(one call in every `fold_mask + 1`: about `max_pending`). A flat list of floats becomes a
numpy array faster than a list of tuples, and `struct.pack` reads it faster than
`np.array` does (docs/benchmarks/ingest.md).
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, TypeVar

import numpy as np
from infersight.monitor.records import CANCELLED, CLIENT_ERROR, InferenceRecord, is_server_error

from ._series import BUCKETS, LATENCY_METRICS, TOKEN_BUCKETS, HistogramState, Tally, WindowedSketches
from .errors import InvalidObservation

__all__ = [
    "MAX_ERROR_TYPES",
    "MAX_LABEL_CHARS",
    "Drained",
    "Pending",
    "Series",
    "check_count",
    "check_label",
    "check_seconds",
    "fold_pending",
    "observations",
]

MAX_ERROR_TYPES = 32  # distinct error_type label values per series; the rest count as "other"

# (end on the stats clock, duration, ttft, tpot, queue, prompt tokens, output tokens, error type)
Pending = tuple[float, float, float | None, float | None, float | None, int | None, int | None, str | None]

_T = TypeVar("_T")
_NOTHING_ELSE = (None, None, None, None, None, None)


def _take(buffer: list[_T], width: int = 1) -> list[_T]:
    """The items in `buffer` now (whole records of `width` items), removed from it; appends
    racing with this stay in it."""
    n = len(buffer)
    n -= n % width
    if not n:
        return []
    batch = buffer[:n]
    del buffer[:n]
    return batch


class Series:
    __slots__ = (
        "_fold",
        "_lock",
        "_max_pending",
        "added",
        "client_outcomes",
        "entered",
        "errors",
        "finished",
        "fold_mask",
        "folded_exits",
        "histograms",
        "left",
        "model",
        "model_version",
        "streamed",
        "timed",
        "tokens",
        "waiting",
        "windows",
    )

    def __init__(
        self,
        model: str,
        model_version: str,
        *,
        windows: WindowedSketches,
        max_pending: int,
        fold: Callable[[Series], None],
    ) -> None:
        self.model = model
        self.model_version = model_version
        self._lock = threading.Lock()  # the queue depth only
        self._max_pending = max(1, max_pending)
        self.fold_mask = (1 << (self._max_pending.bit_length() - 1)) - 1
        self._fold = fold
        self.entered = Tally()  # requests that started (in flight until they finish or leave)
        self.left = Tally()  # requests that left without an observation
        self.timed: list[float] = []  # start, end, start, end, ...
        self.streamed: list[float] = []  # start, first item, end, items, ...
        self.finished: list[Pending] = []
        self.added: list[Pending] = []
        self.waiting = 0  # queue depth, set by an engine adapter or proxy
        # folded state, guarded by the owning InferenceStats' fold lock
        self.folded_exits = 0
        self.histograms = {m: HistogramState(BUCKETS[m]) for m in LATENCY_METRICS}
        self.tokens = {"input": HistogramState(TOKEN_BUCKETS), "output": HistogramState(TOKEN_BUCKETS)}
        self.windows = windows
        self.errors: dict[str, int] = {}  # server errors by error_type
        self.client_outcomes: dict[str, int] = {}  # client_error, cancelled, shed: never errors

    # -- hot path -------------------------------------------------------------------
    def enter(self) -> None:
        """A request started: it counts as in flight until `leave()` or `exit()`."""
        self.entered.incr()

    def leave(self) -> None:
        """A request that `enter()`ed ended with nothing to record (forgotten)."""
        self.left.incr()

    def exit(
        self,
        end: float,
        duration: float,
        ttft: float | None = None,
        tpot: float | None = None,
        queue: float | None = None,
        prompt_tokens: int | None = None,
        output_tokens: int | None = None,
        error_type: str | None = None,
    ) -> None:
        """A request that `enter()`ed finished."""
        if (ttft, tpot, queue, prompt_tokens, output_tokens, error_type) == _NOTHING_ELSE:
            buffer: list = self.timed
            buffer.extend((end - duration, end))
        else:
            buffer = self.finished
            buffer.append((end, duration, ttft, tpot, queue, prompt_tokens, output_tokens, error_type))
        if len(buffer) >= self._max_pending:
            self._fold(self)

    def add(self, observation: Pending) -> None:
        """One finished request that was never counted in flight (ingest, manual API)."""
        self.added.append(observation)
        if len(self.added) >= self._max_pending:
            self._fold(self)

    def add_many(self, observations: Iterable[Pending]) -> None:
        """Several at once (an ingest batch): one extend, folded together."""
        self.added.extend(observations)
        if len(self.added) >= self._max_pending:
            self._fold(self)

    def fold(self) -> None:
        """Fold what is buffered now (the decorator, once in `fold_mask + 1` calls)."""
        self._fold(self)

    def add_waiting(self, delta: int) -> None:
        with self._lock:
            self.waiting = max(0, self.waiting + delta)

    def set_waiting(self, depth: int) -> None:
        """The queue depth as another server reports it (a proxy reading its upstream's metrics)."""
        with self._lock:
            self.waiting = max(0, depth)

    # -- under the owner's fold lock ---------------------------------------------------
    def in_flight(self) -> int:
        """Requests entered and not yet finished; exits are counted before entries, so a
        call that starts and ends during the count is never negative."""
        buffered = len(self.timed) // 2 + len(self.streamed) // 4 + len(self.finished)
        done = self.folded_exits + buffered + self.left.value()
        return max(0, self.entered.value() - done)

    def drain(self) -> Drained:
        """What is buffered, taken out of the buffers."""
        timed = _take(self.timed, 2)
        streamed = _take(self.streamed, 4)
        finished = _take(self.finished)
        added = _take(self.added)
        self.folded_exits += len(timed) // 2 + len(streamed) // 4 + len(finished)
        return Drained(timed, streamed, finished + added if added else finished)

    def reinit_lock(self) -> None:
        self._lock = threading.Lock()


_END, _PROMPT_TOKENS, _OUTPUT_TOKENS, _ERROR = 0, 5, 6, 7


class Drained(NamedTuple):
    timed: list[float]
    streamed: list[float]
    full: list[Pending]


def fold_pending(series: Series, interval_s: float) -> None:
    """Drain `series` and fold what it held (under the owner's fold lock)."""
    drained = series.drain()
    if drained.timed:
        table = _floats(drained.timed).reshape(-1, 2)  # start, end
        end = table[:, 1]
        _fold_columns(series, end, {"request_duration": end - table[:, 0]}, None, interval_s)
    if drained.streamed:
        flat = drained.streamed
        counts = flat[3::4]
        items = np.frombuffer(struct.pack(f"{len(counts)}q", *counts), dtype=np.int64).astype(float)
        del flat[3::4]
        start, first, end = _floats(flat).reshape(-1, 3).T
        several: Any = items > 1
        if several.all():  # the usual stream: no fancy indexing
            several = slice(None)
        tpot = (end[several] - first[several]) / (items[several] - 1)
        values = {"request_duration": end - start, "ttft": first - start}
        _fold_columns(series, end, values, (several, tpot), interval_s)
        series.tokens["output"].fold(items)
    if drained.full:
        _fold_full(series, drained.full, interval_s)


def _floats(values: list[float]) -> np.ndarray:
    """A flat list of Python floats as a float64 array: packed by `struct`, which reads its
    arguments about three times faster than `np.array` reads a list (no type discovery)."""
    return np.frombuffer(struct.pack(f"{len(values)}d", *values), dtype=np.float64)


def _fold_columns(
    series: Series, end: Any, values: dict[str, Any], tpot: tuple[Any, Any] | None, interval_s: float
) -> None:
    """Requests ending at `end` (array), with a value each for the metrics in `values`, and
    `tpot`: (a mask of the requests that have one, their values)."""
    slot_ids = np.floor(end / interval_s).astype(np.int64)
    series.windows.fold_counts(slot_ids, None)
    for name, column in values.items():
        series.histograms[name].fold(column)
        series.windows.fold_values(name, slot_ids, column)
    if tpot is not None and len(tpot[1]):
        series.histograms["tpot"].fold(tpot[1])
        series.windows.fold_values("tpot", slot_ids[tpot[0]], tpot[1])


def _column(values: tuple[float | int | str | None, ...]) -> np.ndarray | None:
    """A float array of the values present (NaN for the missing), None when none are."""
    missing = values.count(None)
    if missing == len(values):
        return None
    if not missing:
        return np.fromiter(values, dtype=float, count=len(values))
    return np.array(values, dtype=float)  # None -> nan


def _fold_full(series: Series, batch: list[Pending], interval_s: float) -> None:
    cols = list(zip(*batch, strict=True))
    ends = _column(cols[_END])
    assert ends is not None
    slot_ids = np.floor(ends / interval_s).astype(np.int64)
    error_col = cols[_ERROR]
    if error_col.count(None) == len(error_col):
        series.windows.fold_counts(slot_ids, None)
    else:  # only server errors count as errors; what the client caused is counted apart
        is_error = np.array([is_server_error(e) for e in error_col], dtype=bool)
        client_error = np.array([e == CLIENT_ERROR for e in error_col], dtype=bool)
        cancelled = np.array([e == CANCELLED for e in error_col], dtype=bool)
        _count_errors(series.errors, series.client_outcomes, error_col)
        series.windows.fold_counts(slot_ids, is_error, client_error, cancelled)
    for column, metric in enumerate(LATENCY_METRICS, start=1):
        values = _column(cols[column])
        if values is None:
            continue
        present = ~np.isnan(values)
        series.histograms[metric].fold(values[present])
        series.windows.fold_values(metric, slot_ids[present], values[present])
    for column, token_type in ((_PROMPT_TOKENS, "input"), (_OUTPUT_TOKENS, "output")):
        values = _column(cols[column])
        if values is not None:
            series.tokens[token_type].fold(values[~np.isnan(values)])


def _count_errors(errors: dict[str, int], client: dict[str, int], column: tuple[str | None, ...]) -> None:
    for error_type in column:
        if error_type is None:
            continue
        if not is_server_error(error_type):  # the client's doing or a refusal (monitor/outcomes.py)
            client[error_type] = client.get(error_type, 0) + 1
            continue
        if error_type not in errors and len(errors) >= MAX_ERROR_TYPES:
            error_type = "other"
        errors[error_type] = errors.get(error_type, 0) + 1


_INF = math.inf


def observations(
    records: Iterable[InferenceRecord], now: float
) -> tuple[dict[tuple[str, str], list[Pending]], InvalidObservation | None]:
    """The observations of `records` at `now`, by (model, model_version), in one pass, and
    the first record's error among those refused (the others are kept). A record as ingest
    validated it (floats, ints, short labels) is checked inline; any other goes through
    `check_seconds`, `check_count` and `check_label`, which accept what they accept one at
    a time (ints as seconds) and name what they refuse."""
    groups: dict[tuple[str, str], list[Pending]] = {}
    error: InvalidObservation | None = None
    for r in records:
        d, a, b, q = r.duration_s, r.ttft_s, r.tpot_s, r.queue_s
        p, o, e = r.prompt_tokens, r.output_tokens, r.error_type
        if (
            type(d) is float
            and 0.0 <= d < _INF
            and (a is None or (type(a) is float and 0.0 <= a < _INF))
            and (b is None or (type(b) is float and 0.0 <= b < _INF))
            and (q is None or (type(q) is float and 0.0 <= q < _INF))
            and (p is None or (type(p) is int and p >= 0))
            and (o is None or (type(o) is int and o >= 0))
            and (e is None or (type(e) is str and 0 < len(e) <= MAX_LABEL_CHARS))
        ):
            row: Pending = (now, d, a, b, q, p, o, e)
        else:
            try:
                duration = check_seconds("duration_s", d, required=True)
                assert duration is not None
                row = (now, duration, check_seconds("ttft_s", a), check_seconds("tpot_s", b),
                       check_seconds("queue_s", q), check_count("prompt_tokens", p),
                       check_count("output_tokens", o), None if e is None else check_label("error_type", e))  # fmt: skip
            except InvalidObservation as exc:
                error = error or exc
                continue
        key = (r.model, r.model_version)
        rows = groups.get(key)
        if rows is None:
            rows = groups[key] = []
        rows.append(row)
    return groups, error


MAX_LABEL_CHARS = 256


def check_seconds(field: str, value: object, *, required: bool = False) -> float | None:
    if value is None:
        if required:
            raise InvalidObservation(field, "missing_duration")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidObservation(field, "invalid_number")
    if math.isnan(value):
        raise InvalidObservation(field, "nan_duration")
    if value < 0:
        raise InvalidObservation(field, "negative_duration")
    if math.isinf(value):
        raise InvalidObservation(field, "infinite_duration")
    return float(value)


def check_count(field: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidObservation(field, "invalid_count")
    return value


def check_label(field: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_LABEL_CHARS:
        raise InvalidObservation(field, "invalid_label")
    return value
