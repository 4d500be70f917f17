"""`GET /healthz` (the process answers), `/readyz` (store reachable and migrated, jobs
running, a backend able to serve), `/metrics` (Prometheus text format)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.concurrency import run_in_threadpool

from ._deps import get_service

__all__ = ["router"]

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: store, jobs and backend ready",
    responses={503: {"description": "not ready"}},
)
async def readyz(request: Request) -> JSONResponse:
    problems = await run_in_threadpool(get_service(request).readiness)
    if problems:
        return JSONResponse({"status": "not ready", "problems": problems}, status_code=503)
    return JSONResponse({"status": "ready", "problems": {}})


@router.get(
    "/metrics",
    summary="Prometheus metrics of the service, collectors, drift and alerts",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
)
async def metrics(request: Request) -> Response:
    service = get_service(request)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(service.exposition)
    body = await run_in_threadpool(generate_latest, registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
