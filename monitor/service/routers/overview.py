"""`GET /api/v1/overview` and `GET /api/v1/timeseries`: what the built-in page draws
(shapes in docs/architecture.md)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from ._deps import get_service
from .models import recent_deploys

__all__ = ["router"]

router = APIRouter(tags=["page"])


def _overview(request: Request) -> dict[str, Any]:
    service = get_service(request)
    backend = get_service(request).parts.backend
    runtime = getattr(backend, "runtime", None)
    alerts = get_service(request).parts.alerts
    drift = get_service(request).parts.drift
    cost = get_service(request).parts.cost
    routing = get_service(request).parts.routing
    firing = alerts.firing_summary() if alerts is not None else []
    problems = service.readiness()
    return {
        "model": getattr(backend, "model_name", None) or service.config.model,
        "serving_version": getattr(runtime, "serving_version", None),
        "health": "ok" if not problems and not firing else "degraded",
        "uptime_s": round(service.uptime_s, 3),
        "firing_alerts": firing,
        "drift": drift.latest_summary() if drift is not None else None,
        "deploys": recent_deploys(service.db, 20),
        "slos": alerts.slo_summary() if alerts is not None else [],
        "cost": [c.to_json() for c in cost.costs()] if cost is not None else [],
        "cost_per_hour": cost.per_hour * max(1, cost.devices()) if cost is not None else None,
        "routing": routing.to_json() if routing is not None else None,  # SLA routing's paths, or None
    }


@router.get(
    "/api/v1/overview", summary="Serving version, health, firing alerts, latest drift verdict, deploys"
)
async def overview(request: Request) -> dict[str, Any]:
    return await run_in_threadpool(_overview, request)


@router.get(
    "/api/v1/timeseries", summary="Latency, throughput, GPU and memory over time (one point per tick)"
)
async def timeseries(
    request: Request, window: float = Query(900.0, gt=0, le=7 * 24 * 3600, description="seconds")
) -> dict[str, Any]:
    service = get_service(request)
    return service.timeseries.window(window, now=service.clock())
