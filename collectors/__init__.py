"""infersight.collectors: what the sidecar samples and exports to Prometheus.

- `InferenceStats`: per-(model, model_version) latency, TTFT, TPOT, queue time, token
  and error statistics, as Prometheus histograms (OpenTelemetry GenAI names) and as
  sliding-window DDSketches the alert engine queries in process.
- `GPUCollector`: NVML readings per device (GPM SM activity and occupancy on Hopper+,
  time-busy fallback, memory, the supervised process's GPU memory, clock, temperature,
  power, memory slope); disabled with a reason where there is no GPU.
- `ProcessCollector`: CPU seconds, RSS, threads and the RSS slope of one process.
- `EngineAdapter`: a subscriber for the embedded runtime's events; `EnginePathCollector`:
  the decode path each serving version runs on (`infersight_engine_path_info`).
- `SlotExporter`, `SlotRecord`, `MergedStats`: the sliding windows of several replicas,
  published by each and merged (exactly, DDSketches merge) for the alert engine.
- `serve_metrics`, `render_metrics`, `metrics_asgi_app`, `metrics_wsgi_app`: /metrics.

Every collector registers into the `CollectorRegistry` it is given, never the global one.
"""

from ._engine_adapter import EngineAdapter, EnginePathCollector
from ._gpu import MIN_GPM_INTERVAL_S, GPUCollector, GPUSample
from ._inference import (
    InferenceStats,
    MetricsServer,
    metrics_asgi_app,
    metrics_wsgi_app,
    render_metrics,
    serve_metrics,
)
from ._process import ProcessCollector, ProcessSample
from ._series import (
    DURATION_BUCKETS,
    LATENCY_METRICS,
    QUEUE_TIME_BUCKETS,
    TOKEN_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    Series,
    Tally,
    register_fork_handler,
)
from ._shared import MergedStats, RemoteStats, SlotExporter, SlotRecord
from .errors import (
    CollectorError,
    InvalidObservation,
    InvalidQuery,
    NVMLUnavailable,
    UnknownMetric,
    WindowTooLong,
)

__all__ = [
    "DURATION_BUCKETS",
    "LATENCY_METRICS",
    "MIN_GPM_INTERVAL_S",
    "QUEUE_TIME_BUCKETS",
    "TOKEN_BUCKETS",
    "TPOT_BUCKETS",
    "TTFT_BUCKETS",
    "CollectorError",
    "EngineAdapter",
    "EnginePathCollector",
    "GPUCollector",
    "GPUSample",
    "InferenceStats",
    "InvalidObservation",
    "InvalidQuery",
    "MergedStats",
    "MetricsServer",
    "NVMLUnavailable",
    "ProcessCollector",
    "ProcessSample",
    "RemoteStats",
    "Series",
    "SlotExporter",
    "SlotRecord",
    "Tally",
    "UnknownMetric",
    "WindowTooLong",
    "metrics_asgi_app",
    "metrics_wsgi_app",
    "register_fork_handler",
    "render_metrics",
    "serve_metrics",
]
