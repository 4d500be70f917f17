"""GPUCollector: per-device NVML readings on a background sampler, served at scrape time.

On a machine without a GPU, a driver or pynvml, the collector is disabled:
`enabled` is False, `disabled_reason` says why, and the registry exports
`infersight_gpu_collector_enabled 0` and `infersight_gpu_collector_disabled_info{reason}`.
Nothing here raises into the caller or into a scrape; failing NVML calls are counted
in `infersight_nvml_errors_total{function}`.

The NVML seam (`open_nvml`, `NVMLCalls`): load the binding, and call it so that a failure
is counted, not raised. The seam is the `pynvml` module itself (nvidia-ml-py): anything with its functions,
constants, `NVMLError` and ctypes structs can stand in for it (tests use
`infersight.collectors.fake_nvml.FakeNVML`).

GPM (GPU Performance Monitoring, Hopper and newer; `GPMSampler`): SM activity and SM
occupancy. GPM metrics are differences between two samples. Each device keeps two sample
buffers and alternates between them; a metric is computed only when the two samples
are at least `MIN_GPM_INTERVAL_S` apart (NVML's guidance: shorter intervals are
noisy). A sample taken too soon is overwritten by the next one, and the last good
values are kept.

Each sampling pass reads every `Device` (handle, identity, GPM sampler, memory trend) into a
`GPUSample`; `gpu_families` turns the latest samples into the Prometheus families of
docs/architecture.md at scrape time.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ._series import Periodic, Trend, register_fork_handler
from .errors import NVMLUnavailable

__all__ = [
    "MIN_GPM_INTERVAL_S",
    "Device",
    "GPMSampler",
    "GPUCollector",
    "GPUSample",
    "NVMLCalls",
    "gpu_families",
    "open_nvml",
]


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


@dataclass(frozen=True, slots=True)
class GPUSample:
    """One device, one pass. A field is None when NVML could not answer it."""

    index: int
    uuid: str
    name: str
    at: float  # the collector's clock (monotonic seconds)
    gpm_supported: bool
    sm_activity: float | None  # GPM: fraction of SMs busy (0..1), Hopper+
    sm_occupancy: float | None  # GPM: active warps / theoretical maximum (0..1), Hopper+
    busy_time_ratio: float | None  # nvmlDeviceGetUtilizationRates: time a kernel ran, NOT SM efficiency
    memory_used_bytes: int | None
    memory_reserved_bytes: int | None
    memory_total_bytes: int | None
    process_memory_bytes: int | None  # the supervised pid's own GPU memory (0 when it holds none)
    sm_clock_hz: float | None
    temperature_celsius: float | None
    power_watts: float | None
    memory_used_slope_bytes_per_minute: float | None


class Device:
    def __init__(self, calls: NVMLCalls, index: int, *, trend_window_s: float) -> None:
        self._calls = calls
        self.index = index
        self.handle = calls("nvmlDeviceGetHandleByIndex", index, device=index)
        self.uuid = _text(calls("nvmlDeviceGetUUID", self.handle, device=index)) or f"GPU-{index}"
        self.name = _text(calls("nvmlDeviceGetName", self.handle, device=index)) or "unknown"
        support = calls("nvmlGpmQueryDeviceSupport", self.handle, device=index)
        self.gpm = (
            GPMSampler(calls, self.handle, index)
            if support is not None and bool(getattr(support, "isSupportedDevice", False))
            else None
        )
        self.trend = Trend(trend_window_s)

    def read(self, now: float, pid: int) -> GPUSample:
        calls, nvml, h, i = self._calls, self._calls.nvml, self.handle, self.index
        used, reserved, total = self._memory()
        if used is not None:
            self.trend.add(now, float(used))
        if self.gpm is not None:
            self.gpm.sample(now)
        util = calls("nvmlDeviceGetUtilizationRates", h, device=i)
        clock = calls("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM, device=i)
        temp = calls("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU, device=i)
        power = calls("nvmlDeviceGetPowerUsage", h, device=i)
        return GPUSample(
            index=i,
            uuid=self.uuid,
            name=self.name,
            at=now,
            gpm_supported=self.gpm is not None and self.gpm.usable,
            sm_activity=None if self.gpm is None else self.gpm.sm_activity,
            sm_occupancy=None if self.gpm is None else self.gpm.sm_occupancy,
            busy_time_ratio=None if util is None else float(util.gpu) / 100.0,
            memory_used_bytes=used,
            memory_reserved_bytes=reserved,
            memory_total_bytes=total,
            process_memory_bytes=self._process_memory(pid),
            sm_clock_hz=None if clock is None else float(clock) * 1e6,
            temperature_celsius=None if temp is None else float(temp),
            power_watts=None if power is None else float(power) / 1000.0,
            memory_used_slope_bytes_per_minute=self.trend.slope_per_minute(),
        )

    def _memory(self) -> tuple[int | None, int | None, int | None]:
        calls, nvml = self._calls, self._calls.nvml
        v2 = "nvmlDeviceGetMemoryInfo_v2"
        if calls.supported(v2, self.index):
            info = calls(
                "nvmlDeviceGetMemoryInfo", self.handle, version=nvml.nvmlMemory_v2, device=self.index, key=v2
            )
            if info is not None:
                return int(info.used), int(info.reserved), int(info.total)
            if calls.supported(v2, self.index):
                return None, None, None  # a passing failure; counted
        # a driver without the v2 struct: v1 from now on (no `reserved`)
        info = calls("nvmlDeviceGetMemoryInfo", self.handle, device=self.index)
        if info is None:
            return None, None, None
        return int(info.used), None, int(info.total)

    def _process_memory(self, pid: int) -> int | None:
        procs = self._calls("nvmlDeviceGetComputeRunningProcesses", self.handle, device=self.index)
        if procs is None:
            return None
        return sum(int(p.usedGpuMemory or 0) for p in procs if p.pid == pid)

    def close(self) -> None:
        if self.gpm is not None:
            self.gpm.close()


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


_DEVICE = ["gpu", "uuid"]
_GAUGES = (
    (
        "sm_activity",
        "infersight_gpu_sm_activity_ratio",
        "GPM SM activity: fraction of SMs busy (0..1), Hopper+.",
    ),
    (
        "sm_occupancy",
        "infersight_gpu_sm_occupancy_ratio",
        "GPM SM occupancy: active warps over the theoretical maximum (0..1), Hopper+.",
    ),
    (
        "busy_time_ratio",
        "infersight_gpu_busy_time_ratio",
        "nvmlDeviceGetUtilizationRates: fraction of time a kernel was running. Time busy, NOT SM efficiency.",
    ),
    ("memory_used_bytes", "infersight_gpu_memory_used_bytes", "GPU memory used (nvmlMemory_v2)."),
    ("memory_reserved_bytes", "infersight_gpu_memory_reserved_bytes", "GPU memory reserved by the driver."),
    ("memory_total_bytes", "infersight_gpu_memory_total_bytes", "GPU memory total."),
    ("sm_clock_hz", "infersight_gpu_sm_clock_hertz", "SM clock."),
    ("temperature_celsius", "infersight_gpu_temperature_celsius", "GPU temperature."),
    ("power_watts", "infersight_gpu_power_watts", "Board power draw."),
    (
        "memory_used_slope_bytes_per_minute",
        "infersight_gpu_memory_used_slope_bytes_per_minute",
        "Least-squares slope of GPU memory used over the trend window.",
    ),
)


def gpu_families(
    enabled: bool,
    reason: str | None,
    samples: Mapping[int, GPUSample],
    nvml_errors: Mapping[str, int],
    pid: int,
) -> list[Metric]:
    on = GaugeMetricFamily("infersight_gpu_collector_enabled", "1 when NVML is usable.")
    on.add_metric([], 1.0 if enabled else 0.0)
    off = InfoMetricFamily(
        "infersight_gpu_collector_disabled", "Why the GPU collector is off.", labels=["reason"]
    )
    if not enabled:
        off.add_metric([], {"reason": reason or "unknown"})
    errors = CounterMetricFamily(
        "infersight_nvml_errors", "Failing NVML calls, counted, never raised.", labels=["function"]
    )
    for function, n in sorted(nvml_errors.items()):
        errors.add_metric([function], n)
    gauges = {field: GaugeMetricFamily(name, doc, labels=_DEVICE) for field, name, doc in _GAUGES}
    process = GaugeMetricFamily(
        "infersight_gpu_process_memory_bytes",
        "GPU memory held by the supervised process.",
        labels=[*_DEVICE, "pid"],
    )
    for index, s in sorted(samples.items()):
        labels = [str(index), s.uuid]
        for field, family in gauges.items():
            value = getattr(s, field)
            if value is not None:
                family.add_metric(labels, float(value))
        if s.process_memory_bytes is not None:
            process.add_metric([*labels, str(pid)], float(s.process_memory_bytes))
    return [on, off, errors, *gauges.values(), process]


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
        register_fork_handler(self)
        if registry is not None:
            registry.register(self)

    def driver_version(self) -> str | None:
        """The NVIDIA driver's version (None: no NVML, or it would not say)."""
        if self._calls is None:
            return None
        value = self._calls("nvmlSystemGetDriverVersion")
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        return None if value is None else str(value)

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
