"""`create_app(config)`: the FastAPI application of `infersight serve`.

The app owns a `Service` (built from the config unless one is given), starts it in the
lifespan and stops it on shutdown. Nothing lives at module level: every app is separate.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from .config import ServiceConfig
from .errors_http import install_error_handlers
from .routers import dataset, health, ingest, models, openai, overview, web
from .security import BodySizeLimit
from .service import Service

__all__ = ["create_app"]

_DESCRIPTION = """Observability and drift monitoring sidecar for LLM inference.

State-changing endpoints need `Authorization: Bearer <token>`. Errors are JSON
`{"error": {"type", "message", "field"}}`."""


def create_app(config: ServiceConfig, *, service: Service | None = None, **service_seams: Any) -> FastAPI:
    """The ASGI app. `service_seams` go to `Service` (runtime=, upstream_transport=, nvml=,
    leader=, clock=)."""
    svc = service if service is not None else Service(config, **service_seams)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not svc.started:  # `infersight serve` starts it first, to report errors as one line
            await run_in_threadpool(svc.start)
        try:
            yield
        finally:
            aclose = getattr(svc.parts.backend, "aclose", None)
            if aclose is not None:
                await aclose()  # httpx closes on the loop its connections belong to
            await run_in_threadpool(svc.stop)

    app = FastAPI(
        title="infersight",
        version="0.1.0",
        description=_DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.service = svc
    app.state.token = svc.token
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=config.limits.max_body_bytes)
    for module in (health, ingest, openai, models, overview, dataset):
        app.include_router(module.router)
    _include_optional_routers(app, svc)
    web.mount(app)
    return app


def _include_optional_routers(app: FastAPI, svc: Service) -> None:
    """Alerts, silences, drift, snapshots and the Alertmanager receiver."""
    from .routers import alerting, drift, snapshots

    app.include_router(alerting.router)
    app.include_router(drift.router)
    alerting.mount_alertmanager(app)
    app.include_router(snapshots.router)
