"""The ring buffer behind `GET /api/v1/timeseries`: one point per scheduler tick, a fixed
number of points kept (memory never grows), `None` where a signal had no data."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from typing import Any

__all__ = ["SERIES", "Timeseries"]

SERIES = (
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "ttft_p95_s",
    "requests_per_s",
    "errors_per_s",  # the server's errors
    "client_errors_per_s",  # refused for the client's fault: not errors
    "cancelled_per_s",  # the client hung up: not errors
    "gpu_sm_activity_ratio",
    "gpu_memory_used_bytes",
    "process_rss_bytes",
)


class Timeseries:
    def __init__(self, capacity: int) -> None:
        self._points: deque[tuple[float, tuple[float | None, ...]]] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def append(self, t: float, values: Mapping[str, float | None]) -> None:
        unknown = set(values) - set(SERIES)
        if unknown:
            raise KeyError(f"unknown series {sorted(unknown)}; known: {', '.join(SERIES)}")
        point = tuple(_clean(values.get(name)) for name in SERIES)
        with self._lock:
            self._points.append((t, point))

    def window(self, seconds: float, *, now: float) -> dict[str, Any]:
        """`{"t": [...], "series": {name: [...]}}` for the points of the last `seconds`."""
        since = now - seconds
        with self._lock:
            points = [p for p in self._points if p[0] >= since]
        return {
            "t": [round(t, 3) for t, _ in points],
            "series": {name: [values[i] for _, values in points] for i, name in enumerate(SERIES)},
        }

    def __len__(self) -> int:
        return len(self._points)


def _clean(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if value == value and value not in (float("inf"), float("-inf")) else None
