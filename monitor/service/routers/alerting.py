"""`/api/v1/alerts` (what fires and what is pending), `/api/v1/silences` (GET, POST,
DELETE: Alertmanager's matcher semantics) and the inbound Alertmanager webhook
`POST /api/v1/alertmanager` (the alerts package's router, behind the bearer token)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from pydantic import BaseModel, Field
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from ..errors import BackendUnavailable
from ..security import require_token
from ._deps import get_service

__all__ = ["mount_alertmanager", "router"]

router = APIRouter(tags=["alerts"])


def _alerts(request: Request) -> Any:
    wiring = get_service(request).parts.alerts
    if wiring is None:
        raise BackendUnavailable("alerting is disabled in this service's config")
    return wiring


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


@router.get("/api/v1/alerts", summary="Alerts pending or firing (and recently resolved)")
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
                 "activeAt": _iso(r.active_at), "firedAt": _iso(r.fired_at), "resolvedAt": _iso(r.resolved_at)}
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


@router.get("/api/v1/silences", summary="Silences (active, pending and recently expired)")
async def list_silences(request: Request, expired: bool = False) -> dict[str, Any]:
    from infersight.alerts import list_silences as _list

    service = get_service(request)
    _alerts(request)
    now = dt.datetime.now(dt.UTC)
    found = await run_in_threadpool(lambda: _list(service.db, now=now, include_expired=expired))
    return {"silences": [s.to_json(now) for s in found]}


@router.post(
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


@router.delete(
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
