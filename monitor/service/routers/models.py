"""`/api/v1/models`: the versions known, the serving one and the deploy history;
`POST /api/v1/models/deploy`, `POST /api/v1/models/rollback` and the canary's
`POST /api/v1/models/canary` (plus `.../canary/promote` and `.../canary/abort`; bearer
token) drive the embedded runtime (409 in proxy mode: the upstream deploys its own models)."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from infersight.monitor.store.tables import deploys
from pydantic import BaseModel, Field
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from ..errors import NoRuntime
from ..security import require_token
from ._deps import get_service

__all__ = ["recent_deploys", "router"]

router = APIRouter(tags=["models"])
_VERSION = r"^[a-z][a-z0-9]*_[a-z][a-z0-9]*_[a-z0-9]+-v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$"


class DeployRequest(BaseModel):
    version: str = Field(
        max_length=256, pattern=_VERSION, description="[arch]_[dataset]_[quant]-v[major].[minor]"
    )


class CanaryRequest(DeployRequest):
    weight: float = Field(
        gt=0.0, le=1.0, allow_inf_nan=False, description="share of users sent to the candidate, in (0, 1]"
    )


class CanaryResult(BaseModel):
    version: str | None
    stable_version: str | None
    weight: float | None
    started_at: float | None
    canary_requests: int
    stable_requests: int
    share_served: float
    decisions: list[dict[str, Any]]


class DeployResult(BaseModel):
    outcome: str
    from_version: str | None
    to_version: str
    reason: str
    at: float
    verify_s: float
    load_s: float
    warmup_s: float


def _iso(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


_SAME_RELEASE_S = 600.0  # replicas switching to one version within this of each other: one release


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
            if r.replica is not None and k == key and r.replica not in replicas and (
                abs((dt.datetime.fromisoformat(out[i]["at"]) - r.at).total_seconds()) <= _SAME_RELEASE_S
            ):  # fmt: skip
                replicas.add(r.replica)
                out[i]["replicas"] = len(replicas)
                out[i]["at"] = _iso(r.at)  # the first replica's switch
                merged = True
                break
        if not merged:
            out.append({"at": _iso(r.at), "from_version": r.from_version, "to_version": r.to_version,
                        "reason": r.reason, "outcome": r.outcome, "detail": r.detail, "replicas": 1})  # fmt: skip
            seen.append((key, {r.replica} if r.replica is not None else set()))
    return out[:limit]


def _runtime(request: Request) -> Any:
    backend = get_service(request).parts.backend
    runtime = getattr(backend, "runtime", None)
    if runtime is None:
        raise NoRuntime("no embedded runtime here (proxy mode): deploy on the upstream server")
    return runtime


@router.get("/api/v1/models", summary="Versions, the serving one, and the deploy history")
async def list_versions(request: Request) -> dict[str, Any]:
    service = get_service(request)
    backend = get_service(request).parts.backend
    runtime = getattr(backend, "runtime", None)
    versions: list[dict[str, Any]] = []
    serving = None
    if runtime is not None:
        serving = runtime.serving_version
        infos = await run_in_threadpool(runtime.registry.versions)
        for v in infos:
            item = v.to_json()
            item.pop("files", None)
            item["serving"] = v.name == serving
            versions.append(item)
    history = await run_in_threadpool(recent_deploys, service.db)
    return {"model": getattr(backend, "model_name", None), "serving_version": serving, "versions": versions,
            "deploys": history}  # fmt: skip


def _outcome(outcome: Any, label: str) -> DeployResult:
    return DeployResult(
        outcome=label, from_version=outcome.from_version, to_version=outcome.to_version, reason=outcome.reason,
        at=outcome.at, verify_s=outcome.verify_s, load_s=outcome.load_s, warmup_s=outcome.warmup_s,
    )  # fmt: skip


def _flush_log(request: Request) -> None:
    log = get_service(request).parts.deploy_log
    if log is not None:
        log.flush()


@router.post(
    "/api/v1/models/deploy", summary="Deploy a registered version (validated, warmed, swapped live)",
    dependencies=[Depends(require_token)], response_model=DeployResult,
    responses={401: {"description": "token"}, 404: {"description": "unknown version"},
               409: {"description": "refused; the serving version keeps serving"}},
)  # fmt: skip
async def deploy(body: DeployRequest, request: Request) -> DeployResult:
    from infersight.engine.errors import DeployRefused

    runtime = _runtime(request)
    if body.version not in runtime.registry:
        raise HTTPException(
            404, {"field": "body.version", "reason": f"version {body.version!r} is not registered"}
        )
    try:
        outcome = await run_in_threadpool(runtime.deploy, body.version)
    except DeployRefused as exc:
        await run_in_threadpool(_flush_log, request)
        raise HTTPException(409, {"field": "body.version", "reason": f"deploy refused: {exc}"}) from None
    await run_in_threadpool(_flush_log, request)
    return _outcome(outcome, "deployed")


@router.post(
    "/api/v1/models/rollback", summary="Roll back to the previous good version",
    dependencies=[Depends(require_token)], response_model=DeployResult,
    responses={401: {"description": "token"}, 409: {"description": "nothing to roll back to, or refused"}},
)  # fmt: skip
async def rollback(request: Request) -> DeployResult:
    from infersight.engine.errors import DeployRefused

    runtime = _runtime(request)
    try:
        outcome = await run_in_threadpool(runtime.rollback)
    except DeployRefused as exc:
        await run_in_threadpool(_flush_log, request)
        raise HTTPException(409, {"field": None, "reason": f"rollback refused: {exc}"}) from None
    await run_in_threadpool(_flush_log, request)
    return _outcome(outcome, "rolled_back")


def _canary_result(request: Request) -> CanaryResult:
    runtime = _runtime(request)
    status = runtime.canary.status
    controller = getattr(get_service(request).parts.backend, "canary_controller", None)
    served = controller.served if controller is not None else {True: 0, False: 0}
    decisions = [asdict(d) for d in controller.decisions[-10:]] if controller is not None else []
    return CanaryResult(
        version=status.version if status else None, stable_version=status.stable_version if status else None,
        weight=status.weight if status else None, started_at=status.started_at if status else None,
        canary_requests=served[True], stable_requests=served[False],
        share_served=controller.share_served if controller is not None else 0.0, decisions=decisions,
    )  # fmt: skip


@router.get("/api/v1/models/canary", summary="The running canary, its traffic and its decisions")
async def canary_status(request: Request) -> CanaryResult:
    return _canary_result(request)


@router.post(
    "/api/v1/models/canary", summary="Serve a registered version beside the stable one to a share of users",
    dependencies=[Depends(require_token)], response_model=CanaryResult,
    responses={401: {"description": "token"}, 404: {"description": "unknown version"},
               409: {"description": "a canary is running, or the candidate was refused"},
               422: {"description": "weight outside (0, 1]"}},
)  # fmt: skip
async def canary(body: CanaryRequest, request: Request) -> CanaryResult:
    from infersight.engine.errors import CanaryRunning, DeployRefused

    runtime = _runtime(request)
    if body.version not in runtime.registry:
        raise HTTPException(
            404, {"field": "body.version", "reason": f"version {body.version!r} is not registered"}
        )
    running = runtime.canary.status
    if running is not None:
        raise HTTPException(409, {"field": "body.version", "reason": f"canary {running.version} is running: "
                                  "promote or abort it first"})  # fmt: skip
    if body.version == runtime.serving_version:
        raise HTTPException(
            409, {"field": "body.version", "reason": f"{body.version} is the serving version"}
        )
    replicas = request.app.state.service.parts.replicas
    elsewhere = await run_in_threadpool(replicas.open_canaries) if replicas is not None else []
    if elsewhere:
        where = ", ".join(f"{v} on replica {r}" for r, v in elsewhere)
        raise HTTPException(409, {"field": "body.version", "reason": f"canary {where} is running: "
                                  "promote or abort it there first"})  # fmt: skip
    controller = getattr(get_service(request).parts.backend, "canary_controller", None)
    if controller is not None:  # before the first request can reach the candidate
        controller.begin(body.version, runtime.serving_version, body.weight)
    try:
        await run_in_threadpool(runtime.canary.start, body.version, body.weight)
    except (CanaryRunning, DeployRefused) as exc:
        if controller is not None and not isinstance(exc, CanaryRunning):
            controller.end()
        await run_in_threadpool(_flush_log, request)
        reason = str(exc) if isinstance(exc, CanaryRunning) else f"canary refused: {exc}"
        raise HTTPException(409, {"field": "body.version", "reason": reason}) from None
    await run_in_threadpool(_flush_log, request)
    return _canary_result(request)


@router.post(
    "/api/v1/models/canary/{action}", summary="Promote the canary to all traffic, or abort it",
    dependencies=[Depends(require_token)], response_model=CanaryResult,
    responses={401: {"description": "token"}, 404: {"description": "no such action"},
               409: {"description": "no canary is running"}},
)  # fmt: skip
async def canary_action(action: str, request: Request) -> CanaryResult:
    from infersight.engine.errors import NoCanary

    runtime = _runtime(request)
    if action not in ("promote", "abort"):
        raise HTTPException(404, {"field": "path.action", "reason": "one of: promote, abort"})
    controller = getattr(get_service(request).parts.backend, "canary_controller", None)
    call = runtime.canary.promote if action == "promote" else runtime.canary.abort
    try:
        await run_in_threadpool(call, f"{action} by the operator (API)")
    except NoCanary as exc:
        raise HTTPException(409, {"field": None, "reason": str(exc)}) from None
    if controller is not None:
        controller.end()
    await run_in_threadpool(_flush_log, request)
    return _canary_result(request)
