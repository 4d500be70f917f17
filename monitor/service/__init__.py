"""The infersight service: `create_app(config)` builds the FastAPI app that `infersight
serve` runs (HTTP API, OpenAI-compatible endpoints, ingest, the page), around a `Service`
that owns the store, the scheduler and the wiring of collectors, drift and alerts.

The other sections of a `ServiceConfig` are in `config`, every error in `errors` (all
derive from `ServiceError`)."""

from __future__ import annotations

from infersight.monitor.extras import require_extra as _require_extra

_require_extra("infersight.monitor.service", "service")  # one line when the extra is missing

from .app import create_app
from .config import EngineConfig, ServiceConfig, UpstreamConfig, load_config
from .errors import ConfigInvalid, ServiceError
from .service import Service

__all__ = [
    "ConfigInvalid",
    "EngineConfig",
    "Service",
    "ServiceConfig",
    "ServiceError",
    "UpstreamConfig",
    "create_app",
    "load_config",
]
