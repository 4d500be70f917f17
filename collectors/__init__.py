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
Every error is in `errors` (all derive from `CollectorError`); the other buckets and the
`Series` handle stay in their modules.
"""

from ._engine_adapter import EngineAdapter, EnginePathCollector
from ._exposition import MetricsServer, metrics_asgi_app, metrics_wsgi_app, render_metrics, serve_metrics
from ._gpu import GPUCollector, GPUSample
from ._inference import InferenceStats
from ._process import ProcessCollector, ProcessSample
from ._series import DURATION_BUCKETS, Tally, register_fork_handler
from ._shared import MergedStats, RemoteStats, SlotExporter, SlotRecord
from .errors import CollectorError, InvalidObservation

__all__ = [
    "DURATION_BUCKETS",
    "CollectorError",
    "EngineAdapter",
    "EnginePathCollector",
    "GPUCollector",
    "GPUSample",
    "InferenceStats",
    "InvalidObservation",
    "MergedStats",
    "MetricsServer",
    "ProcessCollector",
    "ProcessSample",
    "RemoteStats",
    "SlotExporter",
    "SlotRecord",
    "Tally",
    "metrics_asgi_app",
    "metrics_wsgi_app",
    "register_fork_handler",
    "render_metrics",
    "serve_metrics",
]
