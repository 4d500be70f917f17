"""Least-squares slope of a value over a sliding time window (leak detection)."""

from __future__ import annotations

from collections import deque

__all__ = ["Trend"]


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
