"""What the background samplers share: a daemon thread that calls one function every
`interval_s` (`Periodic`), fork safety for the locks and threads they own, and the
least-squares slope of a value over a sliding time window (`Trend`, leak detection).

A lock held by another thread at `fork()` stays held forever in the child. Objects
that own locks register here; one `os.register_at_fork` hook (installed on first
use, not at import) calls their `_after_fork_in_child()`.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Protocol

__all__ = ["ForkAware", "Periodic", "Trend", "register"]


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


def register(obj: ForkAware) -> None:
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
