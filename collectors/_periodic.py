"""A daemon thread that calls one function every `interval_s` until stopped."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Periodic"]


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
