"""The infersight service: `create_app(config)` builds the FastAPI app that `infersight
serve` runs (HTTP API, OpenAI-compatible endpoints, ingest, the page), around a `Service`
that owns the store, the scheduler and the wiring of collectors, drift and alerts."""

from __future__ import annotations

from infersight.monitor.extras import require_extra as _require_extra

_require_extra("infersight.monitor.service", "service")  # one line when the extra is missing

from .app import create_app
from .config import (
    AlertingConfig,
    DriftConfig,
    EngineConfig,
    LimitsConfig,
    ScheduleConfig,
    ServiceConfig,
    UpstreamConfig,
    load_config,
)
from .errors import (
    BackendUnavailable,
    ConfigInvalid,
    IngestOverloaded,
    InsecureBind,
    NoRuntime,
    ServiceError,
    UpstreamUnreachable,
)
from .service import Service

__all__ = [
    "AlertingConfig",
    "BackendUnavailable",
    "ConfigInvalid",
    "DriftConfig",
    "EngineConfig",
    "IngestOverloaded",
    "InsecureBind",
    "LimitsConfig",
    "NoRuntime",
    "ScheduleConfig",
    "Service",
    "ServiceConfig",
    "ServiceError",
    "UpstreamConfig",
    "UpstreamUnreachable",
    "create_app",
    "load_config",
]
