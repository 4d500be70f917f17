"""GPUCollector: per-device NVML readings on a background sampler, served at scrape time.

On a machine without a GPU, a driver or pynvml, the collector is disabled:
`enabled` is False, `disabled_reason` says why, and the registry exports
`infersight_gpu_collector_enabled 0` and `infersight_gpu_collector_disabled_info{reason}`.
Nothing here raises into the caller or into a scrape; failing NVML calls are counted
in `infersight_nvml_errors_total{function}`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from . import _forksafe
from ._exposition_gpu import gpu_families
from ._gpu_device import Device
from ._gpu_sample import GPUSample
from ._nvml import NVMLCalls, open_nvml
from ._periodic import Periodic
from .errors import NVMLUnavailable

__all__ = ["GPUCollector"]


class GPUCollector(Collector):
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        nvml: Any = None,
        pid: int | None = None,
        interval_s: float = 1.0,
        trend_window_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`nvml`: the pynvml module or a stand-in (default: `import pynvml`).
        `pid`: the supervised process whose own GPU memory is reported (default: this one)."""
        self.pid = os.getpid() if pid is None else pid
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: Mapping[int, GPUSample] = MappingProxyType({})
        self._devices: list[Device] = []
        self._calls: NVMLCalls | None = None
        self.disabled_reason: str | None = None
        try:
            self._open(nvml, trend_window_s)
        except NVMLUnavailable as exc:
            self.disabled_reason = str(exc)
        self._sampler = Periodic(self.sample_once, interval_s, name="infersight-gpu")
        _forksafe.register(self)
        if registry is not None:
            registry.register(self)

    def _open(self, nvml: Any, trend_window_s: float) -> None:
        module = open_nvml(nvml)
        calls = NVMLCalls(module)
        count = calls("nvmlDeviceGetCount")
        if not count:
            calls("nvmlShutdown")
            raise NVMLUnavailable(
                "nvmlDeviceGetCount failed" if count is None else "NVML found no GPU on this machine"
            )
        self._calls = calls
        self._devices = [Device(calls, i, trend_window_s=trend_window_s) for i in range(int(count))]

    @property
    def enabled(self) -> bool:
        return self.disabled_reason is None

    def start(self) -> GPUCollector:
        """Sample every `interval_s` on a daemon thread (nothing to do when disabled)."""
        if self.enabled:
            self._sampler.start()
        return self

    def stop(self) -> None:
        self._sampler.stop()

    def close(self) -> None:
        """Stop sampling, free the GPM buffers and shut NVML down."""
        self.stop()
        if self._calls is not None:
            for device in self._devices:
                device.close()
            self._calls("nvmlShutdown")
            self._calls = None
            self.disabled_reason = "closed"

    def sample_once(self) -> Mapping[int, GPUSample]:
        """One pass over every device (what the sampler thread calls)."""
        if self._calls is None:
            return self._latest
        now = self._clock()
        samples = {d.index: d.read(now, self.pid) for d in self._devices}
        with self._lock:
            self._latest = MappingProxyType(samples)
        return self._latest

    def latest(self) -> Mapping[int, GPUSample]:
        """The last pass, by device index; empty before the first or when disabled."""
        return self._latest

    def memory_slope(self, window_s: float) -> dict[int, float | None]:
        """GPU memory used, bytes per minute over the last `window_s` (least squares)."""
        with self._lock:
            return {d.index: d.trend.slope_per_minute(window_s) for d in self._devices}

    def nvml_errors(self) -> dict[str, int]:
        return {} if self._calls is None else self._calls.error_counts()

    def describe(self) -> Iterable[Metric]:
        return gpu_families(True, None, {}, {}, self.pid)

    def collect(self) -> Iterable[Metric]:
        return gpu_families(self.enabled, self.disabled_reason, self._latest, self.nvml_errors(), self.pid)

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._sampler.after_fork_in_child()
        if self._calls is not None:
            self._calls.reinit_lock()
