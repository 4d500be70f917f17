"""The FastAPI application of `infersight serve` and the built-in page it mounts.

`create_app(config)`: the FastAPI application of `infersight serve`.

The app owns a `Service` (built from the config unless one is given), starts it in the
lifespan and stops it on shutdown. Nothing lives at module level: every app is separate.

`/`: the built-in web page (assets written by infersight.dashboards under web/)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from .browser_guard import BrowserGuard
from .config import ServiceConfig
from .http_edge import BodySizeLimit, install_error_handlers
from .rate_limit import REFUSED_REASONS, ClientRateLimit
from .routers import business, ingest, models, monitoring, otlp, progressive, releases
from .service import Service

__all__ = ["create_app", "mount_page", "web_root"]

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
    app.add_middleware(BrowserGuard, listen_host=config.host, allowed_hosts=config.allowed_hosts)
    app.add_middleware(BodySizeLimit, max_bytes=config.limits.max_body_bytes)
    limits = config.limits
    refused = {reason: svc.metrics.http_refused.labels(reason) for reason in REFUSED_REASONS}
    app.add_middleware(  # the outermost: a request over its client's rate costs a look-up and a counter
        ClientRateLimit, rate=limits.client_rate, burst=limits.client_burst, token=lambda: app.state.token,
        token_rate=limits.token_client_rate, token_burst=limits.token_client_burst,
        max_clients=limits.rate_limited_clients,
        on_refused=lambda reason: refused[reason].inc(),
    )  # fmt: skip
    app.add_middleware(otlp.StatusBodies)  # outside the rate limit: its 429s on /v1/traces are Status too
    for module in (monitoring, ingest, models, releases, progressive, otlp, business):
        app.include_router(module.router)
    monitoring.mount_alertmanager(app)
    mount_page(app)
    return app


def web_root() -> Path | None:
    try:
        root = Path(str(resources.files("infersight.dashboards").joinpath("web")))
    except ModuleNotFoundError:
        return None
    return root if (root / "index.html").is_file() else None


def mount_page(app: FastAPI) -> None:
    root = web_root()
    if root is not None:
        app.mount("/", StaticFiles(directory=root, html=True), name="web")
        return

    @app.get("/", include_in_schema=False)
    async def no_page() -> HTMLResponse:
        return HTMLResponse(
            "<!doctype html><title>infersight</title><p>The web page assets are not installed; "
            "the API is at <a href='/docs'>/docs</a>.</p>",
            status_code=200,
        )
