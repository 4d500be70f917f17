"""Releases: the deploy history, releases marked from outside, and the post-deploy analyses.

The embedded runtime reports its own deploys (each one starts a post-deploy analysis). In
proxy mode the sidecar does not see the upstream's releases, so the pipeline that deploys
the upstream says so: `POST /api/v1/deploys` (token) records the release in the deploy
history and starts the same post-deploy analysis for the pair of versions, paired through
`shadow_upstream:` where one is configured (the verdict says so where not). A failed
analysis pages (`PostDeployRegression`, with the failed checks and their figures); there is
no runtime to roll back here, so the page says the upstream is the one to roll back.

`GET /api/v1/analyses` lists the post-deploy analyses, newest first: the versions, the
state (running, passed, superseded, rolled_back, rollback_refused, ...), the window, and the
latest check's verdict with the failed checks and the pair figures. It holds figures, no
user text, so it needs no token, like the deploy history in `GET /api/v1/models`.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from infersight.monitor.store.tables import deploy_analyses, deploys
from pydantic import BaseModel, Field
from sqlalchemy import insert, select
from starlette.concurrency import run_in_threadpool

from ..http_edge import json_time, require_token
from . import get_service

__all__ = ["recent_deploys", "router"]

router = APIRouter(tags=["releases"])

# An upstream's model names are its own (`llama-3-8b-v2`, `org/model:rev`): printable, no
# spaces or control characters, matched whole.
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,255}$"
_SAME_RELEASE_S = 600.0  # replicas switching to one version within this of each other: one release
_CLOCK_SKEW_S = 60.0  # a release marked this far in the future is the caller's clock, not a release


def recent_deploys(db: Any, limit: int = 20) -> list[dict[str, Any]]:
    """Newest first. The same switch made by several replicas (one row each) is one item,
    with the number of replicas that made it, so the list does not grow with replicas."""
    with db.connect() as conn:
        rows = conn.execute(
            select(deploys).order_by(deploys.c.at.desc(), deploys.c.id.desc()).limit(limit * 8)
        ).all()
    out: list[dict[str, Any]] = []
    seen: list[tuple[Any, set[str]]] = []  # (key, replicas) of each item in `out`
    for r in rows:
        key = (r.from_version, r.to_version, r.reason, r.outcome)
        merged = False
        for i, (k, replicas) in enumerate(seen):
            near = abs((dt.datetime.fromisoformat(out[i]["at"]) - r.at).total_seconds()) <= _SAME_RELEASE_S
            if r.replica is not None and k == key and r.replica not in replicas and near:
                replicas.add(r.replica)
                out[i]["replicas"] = len(replicas)
                out[i]["at"] = json_time(r.at)  # the first replica's switch
                merged = True
                break
        if not merged:
            out.append({"at": json_time(r.at), "from_version": r.from_version, "to_version": r.to_version,
                        "reason": r.reason, "outcome": r.outcome, "detail": r.detail, "replicas": 1})  # fmt: skip
            seen.append((key, {r.replica} if r.replica is not None else set()))
    return out[:limit]


class ReleaseMark(BaseModel):
    version: str = Field(
        max_length=256, pattern=_NAME, description="the version now served (as answers name it)"
    )
    previous_version: str | None = Field(
        None,
        max_length=256,
        pattern=_NAME,
        description="the version it replaced (default: shadow_upstream.model where set, else `version`: "
        "the same name before and after the release, compared by time)",
    )
    at: dt.datetime | None = Field(None, description="when the release took traffic (default: now)")


class ReleaseMarked(BaseModel):
    analysis_id: int
    version: str
    previous_version: str
    at: str
    window_ends_at: str
    paired: str  # where the pairs come from, or why the paired checks are off


def _mark(service: Any, body: ReleaseMark) -> ReleaseMarked:
    wiring = service.parts.alerts
    if getattr(service.parts.backend, "runtime", None) is not None:
        raise HTTPException(409, {"field": None, "reason": "the embedded runtime reports its own deploys: "
                                  "deploy with POST /api/v1/models/deploy"})  # fmt: skip
    if wiring is None:
        raise HTTPException(409, {"field": None, "reason": "alerting is disabled (alerting.enabled: false): "
                                  "no post-deploy analysis runs here"})  # fmt: skip
    now = dt.datetime.now(dt.UTC)
    at = now if body.at is None else body.at
    if at.tzinfo is None:
        raise HTTPException(422, {"field": "body.at", "reason": "give the time with its UTC offset"})
    analyzer = wiring.analyzer
    window_s = analyzer.policy.window_s
    if at > now + dt.timedelta(seconds=_CLOCK_SKEW_S):
        raise HTTPException(422, {"field": "body.at", "reason": "the release is in the future"})
    if at < now - dt.timedelta(seconds=window_s):
        reason = f"older than the analysis window ({window_s:.0f} s): nothing is left to analyse"
        raise HTTPException(422, {"field": "body.at", "reason": reason})
    shadow = service.config.shadow_upstream
    previous = body.previous_version or (
        shadow.model if shadow is not None and shadow.model else body.version
    )
    row = {"at": at, "from_version": previous, "to_version": body.version, "reason": "deploy",
           "outcome": "deployed", "detail": "marked by POST /api/v1/deploys (the upstream's release)",
           "replica": service.replica_id}  # fmt: skip
    with service.db.begin() as conn:
        conn.execute(insert(deploys).values(**row))
    analysis_id = analyzer.on_deploy(body.version, previous, at)
    pairs = analyzer.pairs
    if pairs is not None and pairs.enabled:
        paired = "paired: shadow_upstream answers a share of the live requests again"
    else:
        paired = pairs.off_reason if pairs is not None else "paired checks off"
    return ReleaseMarked(
        analysis_id=analysis_id, version=body.version, previous_version=previous, at=str(json_time(at)),
        window_ends_at=str(json_time(at + dt.timedelta(seconds=window_s))), paired=paired,
    )  # fmt: skip


@router.post(
    "/api/v1/deploys", summary="Mark a release of the upstream: starts its post-deploy analysis (proxy mode)",
    dependencies=[Depends(require_token)], status_code=201, response_model=ReleaseMarked,
    responses={401: {"description": "token"}, 409: {"description": "the embedded runtime deploys itself, "
               "or alerting is off"}, 422: {"description": "a bad field, named"}},
)  # fmt: skip
async def mark_release(body: ReleaseMark, request: Request) -> ReleaseMarked:
    return await run_in_threadpool(_mark, get_service(request), body)


def _analysis(row: Any) -> dict[str, Any]:
    evidence = json.loads(row.evidence)
    last = evidence[-1] if evidence else None
    return {
        "id": row.id, "version": row.to_version, "previous_version": row.from_version, "state": row.state,
        "deployed_at": json_time(row.deployed_at), "ends_at": json_time(row.ends_at), "checks": row.checks,
        "failed_checks": row.failed_checks,
        "last_check": None if last is None else {
            "at": last["at"], "verdict": last["verdict"], "failures": last["failures"],
            "pairs": last.get("pairs", 0), "paired": last.get("paired"),
        },
    }  # fmt: skip


@router.get("/api/v1/analyses", summary="Post-deploy analyses, newest first, with their latest verdict")
async def list_analyses(request: Request, limit: int = Query(20, ge=1, le=100)) -> dict[str, Any]:
    db = get_service(request).db

    def read() -> list[dict[str, Any]]:
        with db.connect() as conn:
            rows = conn.execute(
                select(deploy_analyses).order_by(deploy_analyses.c.id.desc()).limit(limit)
            ).all()
        return [_analysis(r) for r in rows]

    return {"analyses": await run_in_threadpool(read)}
