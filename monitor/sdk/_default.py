"""The default monitor behind the module-level `track`, created on first use (never at
import) with its own registry, and `configure()` to set its options."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ._monitor import DEFAULT_MODEL_VERSION, Monitor

__all__ = ["configure", "default_monitor", "track"]


class _Default:
    def __init__(self) -> None:
        self.monitor: Monitor | None = None
        self.lock = threading.Lock()

    def get(self) -> Monitor:
        if self.monitor is None:
            with self.lock:
                if self.monitor is None:
                    self.monitor = Monitor()
        return self.monitor


_default = _Default()


def default_monitor() -> Monitor:
    """The process's default Monitor (its `registry` is what to serve at /metrics)."""
    return _default.get()


def configure(**options: Any) -> Monitor:
    """Set options of the default monitor (sink, sample_rate, redact, ...); returns it."""
    return _default.get().configure(**options)


def track(
    fn: Callable[..., Any] | None = None,
    *,
    model: str | None = None,
    model_version: str = DEFAULT_MODEL_VERSION,
    sample_rate: float | None = None,
    extract_prompt: Callable[[tuple[Any, ...], dict[str, Any]], Any] | None = None,
    extract_response: Callable[[Any], Any] | None = None,
) -> Any:
    """Track calls on the default monitor: `@track(model="m", model_version="v1")`,
    bare `@track`, or `with track(model="m") as call:`. See `Monitor.track`."""
    return _default.get().track(
        fn,
        model=model,
        model_version=model_version,
        sample_rate=sample_rate,
        extract_prompt=extract_prompt,
        extract_response=extract_response,
    )
