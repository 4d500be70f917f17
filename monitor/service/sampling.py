"""One point of the page's timeseries, read from the live statistics and the samplers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .service import Service

__all__ = ["sample_timeseries", "timeseries_point"]


def timeseries_point(
    stats: Any, gpu: Any, process: Any, *, window_s: float, tick_s: float
) -> dict[str, float | None]:
    point: dict[str, float | None] = {}
    if stats is not None:
        w = min(window_s, stats.window_s)
        point["latency_p50_s"] = stats.quantile("request_duration", 0.50, w)
        point["latency_p95_s"] = stats.quantile("request_duration", 0.95, w)
        point["latency_p99_s"] = stats.quantile("request_duration", 0.99, w)
        point["ttft_p95_s"] = stats.quantile("ttft", 0.95, w)
        rate_window = min(max(tick_s, 1.0), stats.window_s)
        point["requests_per_s"] = stats.count(rate_window) / rate_window
        point["errors_per_s"] = stats.count(rate_window, errors_only=True) / rate_window
        point["client_errors_per_s"] = stats.count(rate_window, outcome="client_error") / rate_window
        point["cancelled_per_s"] = stats.count(rate_window, outcome="cancelled") / rate_window
    if gpu is not None:
        samples: Mapping[int, Any] = gpu.latest()
        activity = [s.sm_activity for s in samples.values() if getattr(s, "sm_activity", None) is not None]
        used = [
            s.memory_used_bytes for s in samples.values() if getattr(s, "memory_used_bytes", None) is not None
        ]
        point["gpu_sm_activity_ratio"] = sum(activity) / len(activity) if activity else None
        point["gpu_memory_used_bytes"] = float(sum(used)) if used else None
    if process is not None:
        sample = process.latest()
        rss = getattr(sample, "rss_bytes", None) if sample is not None else None
        point["process_rss_bytes"] = None if rss is None else float(rss)
    return point


def sample_timeseries(service: Service) -> None:
    schedule = service.config.schedule
    point = timeseries_point(
        service.parts.stats,
        service.parts.gpu,
        service.parts.process,
        window_s=schedule.timeseries_window_s,
        tick_s=schedule.timeseries_s,
    )
    service.timeseries.append(service.clock(), point)
