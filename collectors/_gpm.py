"""GPM (GPU Performance Monitoring, Hopper and newer): SM activity and SM occupancy.

GPM metrics are differences between two samples. Each device keeps two sample
buffers and alternates between them; a metric is computed only when the two samples
are at least `MIN_GPM_INTERVAL_S` apart (NVML's guidance: shorter intervals are
noisy). A sample taken too soon is overwritten by the next one, and the last good
values are kept.
"""

from __future__ import annotations

from typing import Any

from ._nvml import NVMLCalls

__all__ = ["MIN_GPM_INTERVAL_S", "GPMSampler"]

MIN_GPM_INTERVAL_S = 0.1


class GPMSampler:
    def __init__(self, calls: NVMLCalls, handle: Any, device: int) -> None:
        self._calls = calls
        self._handle = handle
        self._device = device
        self._buffers = [calls("nvmlGpmSampleAlloc"), calls("nvmlGpmSampleAlloc")]
        self.usable = all(b is not None for b in self._buffers)
        self._current = 0
        self._previous_at: float | None = None
        self.sm_activity: float | None = None  # 0..1
        self.sm_occupancy: float | None = None  # 0..1

    def sample(self, now: float) -> None:
        if not self.usable:
            return
        buffer = self._buffers[self._current]
        if self._calls("nvmlGpmSampleGet", self._handle, buffer, device=self._device) is None:
            self._previous_at = None  # the chain is broken; start a new pair
            self.sm_activity = self.sm_occupancy = None
            return
        if self._previous_at is not None:
            if now - self._previous_at < MIN_GPM_INTERVAL_S:
                return  # too soon: this buffer is overwritten next time
            self._compute(self._buffers[1 - self._current], buffer)
        self._current = 1 - self._current
        self._previous_at = now

    def _compute(self, earlier: Any, later: Any) -> None:
        nvml = self._calls.nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.sample1 = earlier
        request.sample2 = later
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        request.metrics[1].metricId = nvml.NVML_GPM_METRIC_SM_OCCUPANCY
        answer = self._calls("nvmlGpmMetricsGet", request, device=self._device)
        if answer is None:
            self.sm_activity = self.sm_occupancy = None
            return
        self.sm_activity = _ratio(nvml, answer.metrics[0])
        self.sm_occupancy = _ratio(nvml, answer.metrics[1])

    def close(self) -> None:
        for buffer in self._buffers:
            if buffer is not None:
                self._calls("nvmlGpmSampleFree", buffer)
        self._buffers = [None, None]
        self.usable = False


def _ratio(nvml: Any, metric: Any) -> float | None:
    if metric.nvmlReturn != nvml.NVML_SUCCESS:
        return None
    return max(0.0, min(1.0, float(metric.value) / 100.0))
