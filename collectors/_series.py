"""The folded state of one (model, model_version) label set, and what the samplers share.

The pieces, in the order they are used: histogram bucket boundaries (one set serves a
CPU toy model and a Hopper GPU, roughly log-spaced), `Tally` (a counter whose increment is
one C call), `HistogramState` (per-bucket counts and a sum; cumulative counts only for
exposition) and `WindowedSketches` (sliding windows of mergeable DDSketches: time is cut
into intervals, a query merges the intervals that overlap the window). The hot-path
handle that feeds them, and the folding, are in `_recording`.

And what the background samplers share: a daemon thread that calls one function every
`interval_s` (`Periodic`), fork safety for the locks and threads they own, and the
least-squares slope of a value over a sliding time window (`Trend`, leak detection).

A lock held by another thread at `fork()` stays held forever in the child. Objects
that own locks register here; one `os.register_at_fork` hook (installed on first
use, not at import) calls their `_after_fork_in_child()`.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np
from ddsketch import DDSketch
from ddsketch.mapping import LogarithmicMapping
from prometheus_client.utils import floatToGoString

__all__ = [
    "BUCKETS",
    "DURATION_BUCKETS",
    "LATENCY_METRICS",
    "QUEUE_TIME_BUCKETS",
    "TOKEN_BUCKETS",
    "TPOT_BUCKETS",
    "TTFT_BUCKETS",
    "ForkAware",
    "HistogramState",
    "Periodic",
    "Slot",
    "Tally",
    "Trend",
    "WindowedSketches",
    "add_keys",
    "register_fork_handler",
]


class ForkAware(Protocol):
    def _after_fork_in_child(self) -> None: ...


class _Hook:
    def __init__(self) -> None:
        self.objects: weakref.WeakSet[ForkAware] = weakref.WeakSet()
        self.installed = False
        self.lock = threading.Lock()


_hook = _Hook()


def _in_child() -> None:
    _hook.lock = threading.Lock()
    for obj in list(_hook.objects):
        try:
            obj._after_fork_in_child()
        except Exception:  # a broken object must not stop the others from recovering
            continue


def register_fork_handler(obj: ForkAware) -> None:
    _hook.objects.add(obj)
    if not _hook.installed:
        with _hook.lock:
            if not _hook.installed and hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_in_child)
                _hook.installed = True


class Periodic:
    """Calls `fn()` every `interval_s` on a daemon thread; `fn` must not raise
    (the collectors count their own failures); if it does, the loop goes on."""

    def __init__(self, fn: Callable[[], object], interval_s: float, *, name: str) -> None:
        self._fn = fn
        self._interval_s = interval_s
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        stop = self._stop
        while not stop.is_set():
            try:
                self._fn()
            except Exception:  # the sampler must outlive one bad sample
                self.failures += 1
            stop.wait(self._interval_s)

    def after_fork_in_child(self) -> None:
        """Threads do not survive fork: forget the parent's, keep the configuration."""
        self._thread = None
        self._stop = threading.Event()


class Trend:
    """Keeps `(t, value)` points for `window_s` and fits `value = a + b t`.

    `slope_per_minute()` is `b * 60` (e.g. bytes per minute), None with fewer than
    `min_points` points or no spread in time. Times are centred before fitting, so
    large clock values lose no precision.
    """

    __slots__ = ("_min_points", "_points", "window_s")

    def __init__(self, window_s: float, *, min_points: int = 3) -> None:
        self.window_s = window_s
        self._min_points = min_points
        self._points: deque[tuple[float, float]] = deque()

    def add(self, t: float, value: float) -> None:
        self._points.append((t, value))
        while self._points and self._points[0][0] < t - self.window_s:
            self._points.popleft()

    def slope_per_minute(self, window_s: float | None = None) -> float | None:
        points = list(self._points)
        if window_s is not None and points:
            last = points[-1][0]
            points = [p for p in points if p[0] >= last - window_s]
        n = len(points)
        if n < self._min_points:
            return None
        mean_t = sum(t for t, _ in points) / n
        mean_v = sum(v for _, v in points) / n
        sxx = sum((t - mean_t) ** 2 for t, _ in points)
        if sxx <= 0.0:
            return None
        sxy = sum((t - mean_t) * (v - mean_v) for t, v in points)
        return sxy / sxx * 60.0

    def clear(self) -> None:
        self._points.clear()


DURATION_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
TTFT_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
TPOT_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
QUEUE_TIME_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
TOKEN_BUCKETS: tuple[float, ...] = tuple(float(2**i) for i in range(18))  # 1 .. 131072


class Tally:
    """A monotonic event counter.

    `incr()` is `next()` on an `itertools.count`: one C call, atomic under the GIL,
    no lock. Reading advances the same iterator, so `value()` subtracts its own
    reads; callers serialise `value()` under a lock of their own (scrapes are rare).
    """

    __slots__ = ("_it", "_reads", "incr")

    def __init__(self) -> None:
        self._it = itertools.count()
        self._reads = 0
        self.incr = self._it.__next__

    def add(self, n: int) -> None:
        """n increments at once: the iterator advanced n steps inside C (a zero-length deque
        consumes an `islice` of it), not n Python calls."""
        if n > 0:
            _consume(itertools.islice(self._it, n))

    def value(self) -> int:
        v = next(self._it) - self._reads
        self._reads += 1
        return v


_SINK: deque[int] = deque(maxlen=0)  # keeps nothing: extending it only advances an iterator
_consume = _SINK.extend


class HistogramState:
    __slots__ = ("_bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = np.asarray(bounds, dtype=float)
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)  # last: +Inf
        self.sum = 0.0
        self.count = 0

    def fold(self, values: Any) -> None:
        """Add a 1-d float array of finite, non-negative values."""
        if len(values) == 0:
            return
        # le semantics: v falls in the first bucket whose bound is >= v.
        idx = np.searchsorted(self._bounds, values, side="left")
        self.counts += np.bincount(idx, minlength=len(self.counts))
        self.sum += float(values.sum())
        self.count += len(values)

    def cumulative(self) -> list[tuple[str, float]]:
        """`(le, cumulative count)` pairs as `HistogramMetricFamily` wants them."""
        cum = np.cumsum(self.counts)
        les = [floatToGoString(float(b)) for b in self._bounds] + ["+Inf"]
        return [(le, float(c)) for le, c in zip(les, cum, strict=True)]


LATENCY_METRICS = ("request_duration", "ttft", "tpot", "queue_time")


class Slot:
    """One interval: a sketch per latency metric, and request counts: all of them, the
    server's errors, and the outcomes the client caused (refused, hung up), never errors."""

    __slots__ = ("cancelled", "client_errors", "errors", "sketches", "total")

    def __init__(self) -> None:
        self.sketches: dict[str, DDSketch] = {}
        self.total = 0
        self.errors = 0
        self.client_errors = 0
        self.cancelled = 0


class WindowedSketches:
    __slots__ = ("_alpha", "_interval_s", "_keep", "_mapping", "_multiplier", "slots")

    def __init__(self, *, relative_accuracy: float, interval_s: float, window_s: float) -> None:
        self._alpha = relative_accuracy
        self._interval_s = interval_s
        self._keep = math.ceil(window_s / interval_s) + 1
        self._mapping = LogarithmicMapping(relative_accuracy)
        self._multiplier = 1.0 / math.log2(self._mapping.gamma)
        self.slots: dict[int, Slot] = {}

    def slot_index(self, t: float) -> int:
        return math.floor(t / self._interval_s)

    def _slot(self, index: int) -> Slot:
        slot = self.slots.get(index)
        if slot is None:
            slot = self.slots[index] = Slot()
        return slot

    def fold_counts(
        self, slot_ids: Any, errors: Any, client_errors: Any = None, cancelled: Any = None
    ) -> None:
        """`slot_ids`: int array, one per request; `errors` (server errors), `client_errors`
        and `cancelled`: bool arrays, same length (None: none of them)."""
        for i, c in _counts(slot_ids):
            self._slot(i).total += c
        for attr, mask in (("errors", errors), ("client_errors", client_errors), ("cancelled", cancelled)):
            if mask is None or not mask.any():
                continue
            for i, c in _counts(slot_ids[mask]):
                slot = self._slot(i)
                setattr(slot, attr, getattr(slot, attr) + c)

    def fold_values(self, metric: str, slot_ids: Any, values: Any) -> None:
        """Add finite non-negative `values` (float array) at their interval `slot_ids`."""
        if len(values) == 0:
            return
        zero = values <= self._mapping.min_possible
        if zero.any():
            keys = np.zeros(len(values), dtype=np.int64)
            keys[~zero] = np.ceil(np.log2(values[~zero]) * self._multiplier).astype(np.int64)
        else:
            keys = np.ceil(np.log2(values) * self._multiplier).astype(np.int64)
        slots = [i for i, _ in _counts(slot_ids)]
        for sid in slots:
            slot = self._slot(sid)
            sketch = slot.sketches.get(metric)
            if sketch is None:
                sketch = slot.sketches[metric] = DDSketch(self._alpha)
            if len(slots) == 1:
                add_keys(sketch, keys, zero, values)
            else:
                in_slot = slot_ids == sid
                add_keys(sketch, keys[in_slot], zero[in_slot], values[in_slot])

    def evict(self, now: float) -> None:
        oldest = self.slot_index(now) - self._keep
        for index in [i for i in self.slots if i < oldest]:
            del self.slots[index]

    def recent(self, now: float, window_s: float) -> Iterable[Slot]:
        first = self.slot_index(now - window_s)
        return (slot for index, slot in self.slots.items() if index >= first)

    def merged(self, metric: str, now: float, window_s: float, into: DDSketch) -> None:
        for slot in self.recent(now, window_s):
            sketch = slot.sketches.get(metric)
            if sketch is not None:
                into.merge(sketch)


BUCKETS = dict(
    zip(LATENCY_METRICS, (DURATION_BUCKETS, TTFT_BUCKETS, TPOT_BUCKETS, QUEUE_TIME_BUCKETS), strict=True)
)


def add_keys(sketch: DDSketch, keys: Any, zero: Any, values: Any) -> None:
    """Add `values` (a non-empty float array, >= 0) to `sketch` at their `keys` (the sketch's
    mapping's, an int array; `zero`: a bool array of those at or below its smallest value),
    the same bins as `sketch.add(value)` one at a time, in one pass per distinct key.
    (ddsketch has no bulk add: its dense store's bins are used directly, as `_shared` reads them.)"""
    store = sketch._store
    zeros = int(np.count_nonzero(zero))
    counted = _counts(keys[~zero] if zeros else keys)
    if counted:
        store._extend_range(counted[0][0], counted[-1][0])
        bins, offset = store.bins, store.offset
        for key, weight in counted:
            bins[key - offset] += weight
        store.count += len(keys) - zeros
    sketch._zero_count += zeros
    sketch._count += len(values)
    sketch._sum += float(values.sum())
    sketch._min = min(sketch._min, float(values.min()))
    sketch._max = max(sketch._max, float(values.max()))


def _counts(ints: Any) -> list[tuple[int, int]]:
    """(value, how many times) for each distinct value of an int array, ascending: a count
    per value between the least and the greatest (sketch keys and interval indices span a
    few thousand), no sort."""
    if not len(ints):
        return []
    lo, hi = int(ints.min()), int(ints.max())
    if lo == hi:
        return [(lo, len(ints))]
    if hi - lo > 1 << 20:  # a clock that jumped: sort instead
        values, how_many = np.unique(ints, return_counts=True)
        return list(zip(values.tolist(), how_many.tolist(), strict=True))
    counts = np.bincount(ints - lo)
    present = np.flatnonzero(counts)
    return list(zip((present + lo).tolist(), counts[present].tolist(), strict=True))
