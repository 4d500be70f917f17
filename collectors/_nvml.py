"""The NVML seam: load the binding, and call it so that a failure is counted, not raised.

The seam is the `pynvml` module itself (nvidia-ml-py): anything with its functions,
constants, `NVMLError` and ctypes structs can stand in for it (tests use
`infersight.collectors.fake_nvml.FakeNVML`).
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from .errors import NVMLUnavailable

__all__ = ["NVMLCalls", "open_nvml"]


def open_nvml(nvml: Any = None) -> Any:
    """Import (unless given) and initialise NVML; raises `NVMLUnavailable` with the reason."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError as exc:
            raise NVMLUnavailable(f"pynvml (nvidia-ml-py) is not installed: {exc}") from exc
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NVMLUnavailable(f"nvmlInit failed: {exc}") from exc
    except OSError as exc:  # a broken libnvidia-ml.so
        raise NVMLUnavailable(f"nvmlInit failed: {exc}") from exc
    return nvml


class NVMLCalls:
    """Calls NVML functions by name; a raised `NVMLError` is counted per function and
    the call returns None. A function that answers NOT_SUPPORTED or FUNCTION_NOT_FOUND
    for a device is not asked again for that device."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.errors: dict[str, int] = {}
        self._unsupported: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._permanent = {
            getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
            getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
        }

    def supported(self, function: str, device: int) -> bool:
        return (function, device) not in self._unsupported

    def __call__(
        self, function: str, *args: Any, device: int = -1, key: str | None = None, **kwargs: Any
    ) -> Any:
        """`key` names the call in counts and in the unsupported set (default: `function`)."""
        key = key or function
        if (key, device) in self._unsupported:
            return None
        try:
            return getattr(self.nvml, function)(*args, **kwargs)
        except self.nvml.NVMLError as exc:
            self._failed(key, device, permanent=getattr(exc, "value", None) in self._permanent)
            return None
        except (AttributeError, TypeError, OSError):  # an older binding without this function
            self._failed(key, device, permanent=True)
            return None

    def _failed(self, key: str, device: int, *, permanent: bool) -> None:
        with self._lock:
            self.errors[key] = self.errors.get(key, 0) + 1
            if permanent and device >= 0:
                self._unsupported.add((key, device))

    def error_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.errors)

    def reinit_lock(self) -> None:
        self._lock = threading.Lock()
