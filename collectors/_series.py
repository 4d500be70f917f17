"""One (model, model_version) label set: the hot-path handle and its folded state.

The hot path is a lock and an append: `exit()` puts one raw tuple on a pending list
and returns. The tuples are folded into histograms and sliding-window sketches later,
at scrape or query time, or by the caller whose append fills the list (bounded).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._buckets import DURATION_BUCKETS, QUEUE_TIME_BUCKETS, TOKEN_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS
from ._histogram import HistogramState
from ._tally import Tally
from ._window import LATENCY_METRICS, WindowedSketches

__all__ = ["MAX_ERROR_TYPES", "Pending", "Series"]

MAX_ERROR_TYPES = 32  # distinct error_type label values per series; the rest count as "other"

# (end on the stats clock, duration, ttft, tpot, queue, prompt tokens, output tokens, error type)
Pending = tuple[float, float, float | None, float | None, float | None, int | None, int | None, str | None]

_BUCKETS = dict(
    zip(LATENCY_METRICS, (DURATION_BUCKETS, TTFT_BUCKETS, TPOT_BUCKETS, QUEUE_TIME_BUCKETS), strict=True)
)


class Series:
    __slots__ = (
        "_fold",
        "_lock",
        "_max_pending",
        "_pending",
        "client_outcomes",
        "entered",
        "errors",
        "histograms",
        "left",
        "model",
        "model_version",
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
        self._lock = threading.Lock()
        self._pending: list[Pending] = []
        self._max_pending = max_pending
        self._fold = fold
        self.entered = Tally()  # requests that started (in flight until they leave)
        self.left = Tally()
        self.waiting = 0  # queue depth, set by an engine adapter or proxy
        # folded state, guarded by the owning InferenceStats' fold lock
        self.histograms = {m: HistogramState(_BUCKETS[m]) for m in LATENCY_METRICS}
        self.tokens = {"input": HistogramState(TOKEN_BUCKETS), "output": HistogramState(TOKEN_BUCKETS)}
        self.windows = windows
        self.errors: dict[str, int] = {}  # server errors by error_type
        self.client_outcomes: dict[str, int] = {}  # client_error, cancelled: never errors

    # -- hot path -------------------------------------------------------------------
    def enter(self) -> None:
        """A request started: it counts as in flight until `leave()` or `exit()`."""
        self.entered.incr()

    def leave(self) -> None:
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
        """A request that `enter()`ed finished: `leave()` and `add()` in one step."""
        self.left.incr()
        with self._lock:
            self._pending.append((end, duration, ttft, tpot, queue, prompt_tokens, output_tokens, error_type))
            full = len(self._pending) >= self._max_pending
        if full:
            self._fold(self)

    def add(self, observation: Pending) -> None:
        """One finished request that was never counted in flight (ingest, manual API)."""
        with self._lock:
            self._pending.append(observation)
            full = len(self._pending) >= self._max_pending
        if full:
            self._fold(self)

    def add_waiting(self, delta: int) -> None:
        with self._lock:
            self.waiting = max(0, self.waiting + delta)

    def set_waiting(self, depth: int) -> None:
        """The queue depth as another server reports it (a proxy reading its upstream's metrics)."""
        with self._lock:
            self.waiting = max(0, depth)

    # -- folding (under the owner's fold lock) ---------------------------------------
    def take_pending(self) -> list[Pending]:
        with self._lock:
            batch, self._pending = self._pending, []
        return batch

    def reinit_lock(self) -> None:
        self._lock = threading.Lock()
