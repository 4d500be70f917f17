"""infersight's monitor: the SDK decorator, drift scoring, storage, scheduling, HTTP API and CLI."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The SDK's user-facing names, imported on first use so that `import infersight.monitor`
# stays light (no prometheus/numpy until the decorator is used; never torch).
_SDK_NAMES = ("Monitor", "configure", "default_monitor", "feedback", "track")

if TYPE_CHECKING:
    from .sdk import Monitor, configure, default_monitor, feedback, track

__all__ = ["Monitor", "configure", "default_monitor", "feedback", "track"]


def __getattr__(name: str) -> Any:
    if name in _SDK_NAMES:
        from . import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
