"""Prometheus metric families for GPUCollector (names: docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from ._gpu_sample import GPUSample

__all__ = ["gpu_families"]

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
