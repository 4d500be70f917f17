"""Sliding windows of mergeable quantile sketches.

Time is cut into intervals of `interval_s`; each interval keeps one DDSketch per
latency metric and a request/error count. A query merges the intervals that overlap
the window, so "p99 over the last 5 minutes" costs one merge per interval, never a
pass over raw data. A window is resolved to whole intervals: it may include up to one
interval more than asked.

Accuracy: DDSketch (Masson, Rim, Lee, VLDB 2019) with relative accuracy `alpha`
returns, for any quantile q, a value within `alpha` of the exact q-quantile of the
merged data (rank `q * (n - 1)`, lower). Merging sketches keeps the guarantee.

Batches are folded with numpy: values are grouped by sketch bin first (the key is
`ceil(log_gamma(v))`, as ddsketch's LogarithmicMapping computes it), then each bin is
added once with its weight, at the bin's representative value. A value on a bin edge
that rounding puts in the neighbouring bin is still within `alpha` of that bin's
representative, so the guarantee holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from ddsketch import DDSketch
from ddsketch.mapping import LogarithmicMapping

__all__ = ["LATENCY_METRICS", "Slot", "WindowedSketches"]

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
        ids, counts = np.unique(slot_ids, return_counts=True)
        for i, c in zip(ids.tolist(), counts.tolist(), strict=True):
            self._slot(i).total += c
        for attr, mask in (("errors", errors), ("client_errors", client_errors), ("cancelled", cancelled)):
            if mask is None or not mask.any():
                continue
            ids, counts = np.unique(slot_ids[mask], return_counts=True)
            for i, c in zip(ids.tolist(), counts.tolist(), strict=True):
                slot = self._slot(i)
                setattr(slot, attr, getattr(slot, attr) + c)

    def fold_values(self, metric: str, slot_ids: Any, values: Any) -> None:
        """Add finite non-negative `values` (float array) at their interval `slot_ids`."""
        if len(values) == 0:
            return
        zero = values <= self._mapping.min_possible
        keys = np.zeros(len(values), dtype=np.int64)
        keys[~zero] = np.ceil(np.log2(values[~zero]) * self._multiplier).astype(np.int64)
        for sid in np.unique(slot_ids).tolist():
            in_slot = slot_ids == sid
            sketch = self._slot(sid).sketches.get(metric)
            if sketch is None:
                sketch = self._slot(sid).sketches[metric] = DDSketch(self._alpha)
            zeros = int(np.count_nonzero(zero & in_slot))
            if zeros:
                sketch.add(0.0, float(zeros))
            bins, weights = np.unique(keys[in_slot & ~zero], return_counts=True)
            for key, weight in zip(bins.tolist(), weights.tolist(), strict=True):
                sketch.add(self._mapping.value(key), float(weight))

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
