"""Business signals: users' feedback in; satisfaction against latency, the environment
record and an alert's slowdown diagnosis out.

`POST /api/v1/feedback` (bearer token): one item `{request_id, score | thumbs | rating,
kind?, comment?, user?}` or a batch `{"feedback": [item, ...], "source"?: "http"|"sdk"}`;
all or nothing: a bad item is a 422 naming its field and nothing is stored. Answer
`{"accepted": n, "joined": k}`: k of them already have their request (the others join
when it arrives, or expire after `feedback_ttl_s`).

`GET /api/v1/satisfaction?metric=e2e|ttft[&version=V][&since=7d][&target_ms=Y][&kind=K]`:
per version and path, the satisfaction rate by latency bucket, the fitted curve with its
95% band and what a p99 cut to `target_ms` (default: half the p99) is worth.

`GET /api/v1/environment`: the current environment record and the history.

`GET /api/v1/alerts/{fingerprint}/diagnosis`: the checklist of the alert's episode (the
`diagnose` action's), or run now when the alert's rule has none."""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import asdict
from typing import Any

import orjson
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from infersight.monitor.business import (
    METRICS,
    FeedbackInvalid,
    TextKeeping,
    current_environment,
    environment_history,
    joined_feedback,
    parse_feedback,
    satisfaction_by_group,
    store_feedback,
)
from infersight.monitor.store.tables import action_runs, alerts, requests
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from ..http_edge import require_token
from . import get_service

__all__ = ["router"]

router = APIRouter(tags=["business"])

_MAX_BATCH = 1000
_ITEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["request_id"],
    "properties": {
        "request_id": {"type": "string", "minLength": 1, "maxLength": 256,
                       "description": "the answer's `id` (served or proxied), or an OTLP request's id"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "thumbs": {"type": "string", "enum": ["up", "down"]},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5, "description": "normalised to (rating - 1) / 4"},
        "kind": {"type": "string", "minLength": 1, "maxLength": 64, "description": "what was rated"},
        "comment": {"type": "string", "minLength": 1, "maxLength": 4096},
        "user": {"type": "string", "minLength": 1, "maxLength": 256},
    },
    "description": "exactly one of score, thumbs or rating",
}  # fmt: skip
_BODY_SCHEMA: dict[str, Any] = {
    "oneOf": [
        _ITEM_SCHEMA,
        {"type": "object", "additionalProperties": False, "required": ["feedback"],
         "properties": {"feedback": {"type": "array", "minItems": 1, "maxItems": _MAX_BATCH, "items": _ITEM_SCHEMA},
                        "source": {"type": "string", "enum": ["http", "sdk"]}}},
    ]
}  # fmt: skip


def _unprocessable(field: str, reason: str) -> HTTPException:
    return HTTPException(status_code=422, detail={"field": field, "reason": reason})


def _items(payload: Any) -> tuple[list[Any], str]:
    if isinstance(payload, dict) and "feedback" in payload:
        extra = sorted(k for k in payload if k not in ("feedback", "source"))
        if extra:
            raise _unprocessable(f"body.{extra[0]}", "unknown field")
        source = payload.get("source", "http")
        if source not in ("http", "sdk"):
            raise _unprocessable("body.source", "must be 'http' or 'sdk'")
        items = payload["feedback"]
        if not isinstance(items, list) or not items:
            raise _unprocessable("body.feedback", "must be a non-empty list of feedback items")
        if len(items) > _MAX_BATCH:
            raise _unprocessable("body.feedback", f"at most {_MAX_BATCH} items")
        return items, source
    return [payload], "http"


@router.post(
    "/api/v1/feedback", summary="A user's feedback on a request (by the answer's id)",
    dependencies=[Depends(require_token)],
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": _BODY_SCHEMA}}}},
    responses={401: {"description": "missing or wrong token"}, 422: {"description": "bad item; nothing stored"}},
)  # fmt: skip
async def post_feedback(request: Request) -> dict[str, int]:
    service = get_service(request)
    try:
        payload = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise _unprocessable("body", f"not valid JSON: {exc}") from None
    raw, source = _items(payload)
    parsed = []
    for i, item in enumerate(raw):
        try:
            parsed.append(parse_feedback(item))
        except FeedbackInvalid as exc:
            where = "body" if len(raw) == 1 and raw[0] is payload else f"body.feedback[{i}]"
            raise _unprocessable(
                f"{where}.{exc.field}" if exc.field != "body" else where, exc.reason
            ) from None
    keeping = TextKeeping(sample_rate=service.config.text_sample_rate, redact=service.redactor)
    now = dt.datetime.fromtimestamp(service.clock(), dt.UTC)

    def store() -> dict[str, int]:
        n = store_feedback(service.db, parsed, source=source, now=now, text=keeping)
        ids = {f.request_id for f in parsed}
        with service.db.connect() as conn:
            known = {
                r[0]
                for r in conn.execute(select(requests.c.request_id).where(requests.c.request_id.in_(ids)))
            }
        return {"accepted": n, "joined": sum(f.request_id in known for f in parsed)}

    return await run_in_threadpool(store)


def _since(text: str, now: dt.datetime) -> dt.datetime:
    from infersight.monitor.dataset import DatasetError, parse_since

    try:
        return parse_since(text, now=now)
    except DatasetError as exc:
        raise _unprocessable("query.since", str(exc)) from None


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


@router.get("/api/v1/satisfaction", summary="Satisfaction against latency, per version and path")
async def get_satisfaction(
    request: Request,
    metric: str = Query("e2e", description="e2e (end-to-end) or ttft (time to first token)"),
    version: str | None = Query(None, max_length=256),
    since: str = Query("7d", max_length=64, description="ISO 8601 time or a duration such as 24h"),
    target_ms: float | None = Query(None, gt=0, description="the p99 after the cut (default: half the p99)"),
    kind: str | None = Query(None, max_length=64, description="only feedback of this kind"),
) -> dict[str, Any]:
    if metric not in METRICS:
        raise _unprocessable("query.metric", f"must be one of {', '.join(METRICS)}")
    service = get_service(request)
    start = _since(since, dt.datetime.fromtimestamp(service.clock(), dt.UTC))

    def fit() -> list[dict[str, Any]]:
        items = joined_feedback(service.db, since=start, model_version=version, kind=kind)
        fits = satisfaction_by_group(
            items, metric=metric, target_s=None if target_ms is None else target_ms / 1000
        )
        out = []
        for f in fits:
            obj = _finite(asdict(f))  # the last bucket's upper edge (inf) is null: JSON has no inf
            obj["worth_sentence"] = f.worth.sentence() if f.worth is not None else None
            out.append(obj)
        return out

    groups = await run_in_threadpool(fit)
    return {
        "metric": metric,
        "since": start.isoformat(),
        "adjustment": "stratified by prompt length (tertiles): one intercept per stratum, one latency slope",
        "groups": groups,
    }


@router.get(
    "/api/v1/environment", summary="The software this service runs on, now and at each start and deploy"
)
async def get_environment(request: Request, limit: int = Query(50, ge=1, le=1000)) -> dict[str, Any]:
    service = get_service(request)
    history = await run_in_threadpool(environment_history, service.db, limit=limit)
    current = history[0].to_json() if history else {"versions": current_environment()}
    return {"current": current, "history": [r.to_json() for r in history]}


@router.get("/api/v1/alerts/{fingerprint}/diagnosis", summary="An alert's slowdown checklist, ranked")
async def get_diagnosis(request: Request, fingerprint: str) -> dict[str, Any]:
    service = get_service(request)
    business = service.parts.business

    def find() -> dict[str, Any]:
        with service.db.connect() as conn:
            alert = conn.execute(select(alerts).where(alerts.c.fingerprint == fingerprint)).first()
            if alert is None:
                raise HTTPException(404, {"field": "path.fingerprint", "reason": "no such alert"})
            run = conn.execute(select(action_runs.c.detail).where(
                action_runs.c.run_key == f"diagnose:{alert.episode}", action_runs.c.state == "succeeded")).first()  # fmt: skip
        if run is not None:
            found = json.loads(run.detail).get("diagnosis")
            if found:
                return {"fingerprint": fingerprint, "ran": "with the alert", **found}
        if business is None:
            raise HTTPException(503, {"field": None, "reason": "the service is not started"})
        labels = json.loads(alert.labels)
        now = dt.datetime.fromtimestamp(service.clock(), dt.UTC)
        return {"fingerprint": fingerprint, "ran": "now", **business.diagnose(alert.alertname, labels, now)}

    return await run_in_threadpool(find)
