"""A Prometheus histogram's folded state: per-bucket counts and a sum.

Observations arrive in batches (numpy arrays) at scrape or query time, so the hot
path never touches a bucket. Cumulative counts are computed only for exposition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from prometheus_client.utils import floatToGoString

__all__ = ["HistogramState"]


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
