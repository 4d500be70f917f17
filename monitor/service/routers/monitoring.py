"""What the service knows of its own state: health and `/metrics`, the page's overview and
timeseries, alerts and silences, drift.

`GET /healthz` (the process answers), `/readyz` (store reachable and migrated, jobs
running, a backend able to serve), `/metrics` (Prometheus text format).

`GET /api/v1/overview` and `GET /api/v1/timeseries`: what the built-in page draws
(shapes in docs/architecture.md).

`/api/v1/alerts` (what fires and what is pending), `/api/v1/silences` (GET, POST,
DELETE: Alertmanager's matcher semantics) and the inbound Alertmanager webhook
`POST /api/v1/alertmanager` (the alerts package's router, behind the bearer token).

`GET /api/v1/replicas` (bearer token: host names and pids): every replica with a heartbeat
on the shared database, the version it serves, the leader, its last heartbeat.

`GET /api/v1/drift` (latest report summaries and the stored references),
`GET /api/v1/drift/{report_id}` (bearer token: the full report as `DriftReport.to_json()`
gives it, whose explanation quotes prompts and answers) and
`POST /api/v1/drift/evaluate` (bearer token: run the batch test now)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from ..errors import BackendUnavailable
from ..http_edge import json_time, require_token
from ..pair_feed import pairs_overview
from . import get_service
from .releases import recent_deploys

__all__ = ["mount_alertmanager", "router"]

health_router = APIRouter(tags=["health"])


@health_router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@health_router.get(
    "/readyz",
    summary="Readiness: store, jobs and backend ready",
    responses={503: {"description": "not ready"}},
)
async def readyz(request: Request) -> JSONResponse:
    problems = await run_in_threadpool(get_service(request).readiness)
    if problems:
        return JSONResponse({"status": "not ready", "problems": problems}, status_code=503)
    return JSONResponse({"status": "ready", "problems": {}})


@health_router.get(
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


overview_router = APIRouter(tags=["page"])


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
        "pairs": pairs_overview(
            getattr(backend, "pair_feed", None), proxy=service.config.upstream is not None
        ),
    }


@overview_router.get(
    "/api/v1/overview", summary="Serving version, health, firing alerts, latest drift verdict, deploys"
)
async def overview(request: Request) -> dict[str, Any]:
    return await run_in_threadpool(_overview, request)


@overview_router.get(
    "/api/v1/timeseries", summary="Latency, throughput, GPU and memory over time (one point per tick)"
)
async def timeseries(
    request: Request, window: float = Query(900.0, gt=0, le=7 * 24 * 3600, description="seconds")
) -> dict[str, Any]:
    service = get_service(request)
    return service.timeseries.window(window, now=service.clock())


alerting_router = APIRouter(tags=["alerts"])


def _alerts(request: Request) -> Any:
    wiring = get_service(request).parts.alerts
    if wiring is None:
        raise BackendUnavailable("alerting is disabled in this service's config")
    return wiring


@alerting_router.get("/api/v1/alerts", summary="Alerts pending or firing (and recently resolved)")
async def list_alerts(
    request: Request, state: str | None = Query(None, pattern="^(pending|firing|resolved)$")
) -> dict[str, Any]:
    from infersight.monitor.store.tables import alerts

    service = get_service(request)
    _alerts(request)

    def read() -> list[dict[str, Any]]:
        q = select(alerts).order_by(alerts.c.active_at.desc()).limit(500)
        if state is not None:
            q = q.where(alerts.c.state == state)
        with service.db.connect() as conn:
            rows = conn.execute(q).all()
        return [{"fingerprint": r.fingerprint, "alertname": r.alertname, "state": r.state, "value": r.value,
                 "labels": json.loads(r.labels), "annotations": json.loads(r.annotations),
                 "activeAt": json_time(r.active_at), "firedAt": json_time(r.fired_at), "resolvedAt": json_time(r.resolved_at)}
                for r in rows]  # fmt: skip

    return {"alerts": await run_in_threadpool(read)}


class MatcherIn(BaseModel):
    name: str = Field(min_length=1, max_length=256, pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    value: str = Field(max_length=1024)
    isRegex: bool = False
    isEqual: bool = True


class SilenceIn(BaseModel):
    matchers: list[MatcherIn] = Field(min_length=1, max_length=32)
    startsAt: dt.datetime | None = None
    endsAt: dt.datetime
    createdBy: str = Field(min_length=1, max_length=256)
    comment: str = Field(min_length=1, max_length=4096)


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


@alerting_router.get("/api/v1/silences", summary="Silences (active, pending and recently expired)")
async def list_silences(request: Request, expired: bool = False) -> dict[str, Any]:
    from infersight.alerts import list_silences as _list

    service = get_service(request)
    _alerts(request)
    now = dt.datetime.now(dt.UTC)
    found = await run_in_threadpool(lambda: _list(service.db, now=now, include_expired=expired))
    return {"silences": [s.to_json(now) for s in found]}


@alerting_router.post(
    "/api/v1/silences", summary="Create a silence (Alertmanager's matcher semantics)",
    dependencies=[Depends(require_token)], status_code=201,
    responses={401: {"description": "token"}, 422: {"description": "invalid silence"}},
)  # fmt: skip
async def create_silence(body: SilenceIn, request: Request) -> dict[str, Any]:
    from infersight.alerts import InvalidMatcher, Matcher
    from infersight.alerts import create_silence as _create

    service = get_service(request)
    _alerts(request)
    now = dt.datetime.now(dt.UTC)
    try:
        matchers = [
            Matcher(
                m.name, ("=~" if m.isEqual else "!~") if m.isRegex else ("=" if m.isEqual else "!="), m.value
            )
            for m in body.matchers
        ]
        starts = _utc(body.startsAt) if body.startsAt is not None else now
        silence = await run_in_threadpool(
            lambda: _create(
                service.db,
                matchers,
                starts_at=starts,
                ends_at=_utc(body.endsAt),
                created_by=body.createdBy,
                comment=body.comment,
                now=now,
            )
        )
    except InvalidMatcher as exc:
        raise HTTPException(422, {"field": "body.matchers", "reason": str(exc)}) from None
    except (OverflowError, ValueError) as exc:
        raise HTTPException(422, {"field": "body.endsAt", "reason": str(exc)}) from None
    return {"silenceID": silence.id, "silence": silence.to_json(now)}


@alerting_router.delete(
    "/api/v1/silences/{silence_id}", summary="Expire a silence now", dependencies=[Depends(require_token)],
    responses={401: {"description": "token"}, 404: {"description": "no such active silence"}},
)  # fmt: skip
async def delete_silence(silence_id: str, request: Request) -> dict[str, Any]:
    from infersight.alerts import expire_silence

    service = get_service(request)
    _alerts(request)
    if len(silence_id) > 64:
        raise HTTPException(404, {"field": "path.silence_id", "reason": "no such active silence"})
    done = await run_in_threadpool(
        lambda: expire_silence(service.db, silence_id, now=dt.datetime.now(dt.UTC))
    )
    if not done:
        raise HTTPException(404, {"field": "path.silence_id", "reason": "no such active silence"})
    return {"expired": silence_id}


class _LazyHandler:
    """The alerts router wants its handler when the app is built; the handler exists once
    the service has started. This forwards to it then."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def handle(self, body: Any) -> Any:
        wiring = self.app.state.service.parts.alerts
        if wiring is None:
            raise BackendUnavailable("alerting is disabled in this service's config")
        return wiring.alertmanager.handle(body)


def mount_alertmanager(app: FastAPI) -> None:
    from infersight.alerts.inbound_router import alertmanager_router

    app.include_router(alertmanager_router(_LazyHandler(app), dependencies=[Depends(require_token)]))


drift_router = APIRouter(tags=["drift"])


def _drift(request: Request) -> Any:
    wiring = get_service(request).parts.drift
    if wiring is None:
        raise BackendUnavailable("drift scoring is disabled in this service's config")
    return wiring


@drift_router.get("/api/v1/drift", summary="Latest drift reports (summaries) and references")
async def drift_overview(
    request: Request,
    model_version: str | None = Query(None, max_length=256),
    limit: int = Query(20, ge=1, le=200),
) -> dict[str, Any]:
    from infersight.monitor.drift import list_references, list_reports

    service = get_service(request)
    _drift(request)

    def read() -> dict[str, Any]:
        reports = list_reports(service.db, model_version=model_version, limit=limit)
        references = [r.to_json() for r in list_references(service.db)]
        return {"reports": reports, "references": references}

    return await run_in_threadpool(read)


@drift_router.get(
    "/api/v1/drift/{report_id}", summary="One drift report in full (quotes user text)",
    dependencies=[Depends(require_token)], responses={401: {"description": "token"}, 404: {"description": "none"}},
)  # fmt: skip
async def drift_report(request: Request, report_id: int = Path(ge=1, le=2**31 - 1)) -> Any:
    from infersight.monitor.drift import load_report

    service = get_service(request)
    _drift(request)
    report = await run_in_threadpool(load_report, service.db, report_id)
    if report is None:
        raise HTTPException(404, {"field": "path.report_id", "reason": f"no drift report {report_id}"})
    return report


@drift_router.post(
    "/api/v1/drift/evaluate", summary="Run the batch drift test now on every active model version",
    dependencies=[Depends(require_token)], responses={401: {"description": "token"}},
)  # fmt: skip
async def evaluate_now(request: Request) -> dict[str, Any]:
    wiring = _drift(request)
    reports = await run_in_threadpool(lambda: wiring.evaluate(force=True))
    return {"reports": [r.summary_json() for r in reports]}


@overview_router.get(
    "/api/v1/replicas", summary="The replicas on this service's database: version, leader, last heartbeat",
    dependencies=[Depends(require_token)], responses={401: {"description": "token"}},
)  # fmt: skip
async def list_replicas(request: Request) -> dict[str, Any]:
    replicas = get_service(request).parts.replicas
    if replicas is None:
        raise BackendUnavailable("no replica heartbeat here: the service runs without live statistics")
    return {"replicas": await run_in_threadpool(replicas.listing)}


# one router for the app to include, the groups' tags kept on their endpoints
router = APIRouter()
for _part in (health_router, overview_router, alerting_router, drift_router):
    router.include_router(_part)
