"""Serving and the models served: the OpenAI-compatible `/v1`, deploys and canaries, and
snapshots of what was served.

OpenAI-compatible `/v1/completions`, `/v1/chat/completions` (SSE streaming with
`"stream": true`) and `/v1/models`, served by the embedded runtime or the upstream proxy.

Inference does not change the service's state, so these take no infersight token; in
proxy mode the client's own `Authorization` header goes to the upstream. Answers name the
stable model, never the version that served them (a canary's clients cannot tell their
arm); with the token, the `x-infersight-version` header says which version answered.
A client that hangs up before its non-streamed answer is ready cancels it (`unless_hung_up`).

The body is read here and validated by what serves it: the embedded runtime checks the
OpenAI subset it serves (`CompletionRequest`, `ChatRequest`); the proxy only needs a JSON
object and forwards it byte for byte (`ObservedRequest`), so the upstream decides.

`/api/v1/models`: the versions known, the serving one and the deploy history;
`POST /api/v1/models/deploy`, `POST /api/v1/models/rollback` and the canary's
`POST /api/v1/models/canary` (plus `.../canary/promote` and `.../canary/abort`; bearer
token) drive the embedded runtime (409 in proxy mode: the upstream deploys its own models).

`GET /api/v1/snapshots` (newest first), `GET /api/v1/snapshots/{id}` (its full content:
prompts and answers) and `POST /api/v1/snapshots` (take an inference snapshot now, the same
action the alert rules run). All three need the bearer token: snapshots hold user text."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict
from typing import Any

import orjson
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from infersight.monitor.store.tables import snapshots
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from ..errors import BackendUnavailable, NoRuntime
from ..http_edge import has_token, json_time, require_token, unless_hung_up
from ..openai_api import ChatRequest, CompletionRequest, ObservedRequest
from . import get_service
from .releases import recent_deploys

__all__ = ["router"]

openai_router = APIRouter(tags=["openai"])

_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "the completion (JSON), or an SSE stream of chunks ending with `data: [DONE]`",
          "content": {"text/event-stream": {}}},
    400: {"description": "prompt too long for the model (code context_length_exceeded)"},
    404: {"description": "unknown model"},
    502: {"description": "upstream did not answer"},
    503: {"description": "no backend serving"},
}  # fmt: skip


def _backend(request: Request) -> Any:
    backend = get_service(request).parts.backend
    if backend is None:
        raise BackendUnavailable("no model is served here: start with an engine registry or --upstream URL")
    return backend


def _body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of the engine's model (the page /docs shows), refs inlined."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {k: inline(v) for k, v in node.items()}
        return [inline(v) for v in node] if isinstance(node, list) else node

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}}


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise RequestValidationError(
            [{"loc": ("body",), "msg": "the body is not valid JSON", "type": "json"}]
        ) from None
    if not isinstance(body, dict):
        raise RequestValidationError(
            [{"loc": ("body",), "msg": "the body must be a JSON object", "type": "json"}]
        )
    return body


def _validated(model: type[BaseModel], body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


def _proxying(backend: Any) -> bool:
    return bool(getattr(backend, "passes_through", False))


@openai_router.post("/v1/completions", summary="Text completion (OpenAI API)", responses=_RESPONSES,
             openapi_extra=_body_doc(CompletionRequest))  # fmt: skip
async def completions(request: Request) -> Response:
    raw = await request.body()  # first: an oversize body is a 413 whatever serves it
    backend = _backend(request)
    body = _json_object(raw)
    req = ObservedRequest.completion(body) if _proxying(backend) else _validated(CompletionRequest, body)
    work = backend.completion(req, raw, request.headers, reveal_version=has_token(request))
    return await unless_hung_up(request, work)


@openai_router.post("/v1/chat/completions", summary="Chat completion (OpenAI API)", responses=_RESPONSES,
             openapi_extra=_body_doc(ChatRequest))  # fmt: skip
async def chat_completions(request: Request) -> Response:
    raw = await request.body()  # first: an oversize body is a 413 whatever serves it
    backend = _backend(request)
    body = _json_object(raw)
    req = ObservedRequest.chat(body) if _proxying(backend) else _validated(ChatRequest, body)
    work = backend.chat(req, raw, request.headers, reveal_version=has_token(request))
    return await unless_hung_up(request, work)


@openai_router.get(
    "/v1/models", summary="Models served (OpenAI API)", responses={503: {"description": "no backend"}}
)
async def list_models(request: Request) -> Response:
    result = await _backend(request).models()
    return result if isinstance(result, Response) else JSONResponse(result)


models_router = APIRouter(tags=["models"])
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


def _runtime(request: Request) -> Any:
    backend = get_service(request).parts.backend
    runtime = getattr(backend, "runtime", None)
    if runtime is None:
        raise NoRuntime("no embedded runtime here (proxy mode): deploy on the upstream server")
    return runtime


@models_router.get("/api/v1/models", summary="Versions, the serving one, and the deploy history")
async def list_versions(request: Request) -> dict[str, Any]:
    service = get_service(request)
    backend = get_service(request).parts.backend
    runtime = getattr(backend, "runtime", None)
    versions: list[dict[str, Any]] = []
    serving = None
    # where the checkpoints lie on disk tells an attacker about the host: with the token only
    with_token = has_token(request)
    if runtime is not None:
        serving = runtime.serving_version
        infos = await run_in_threadpool(runtime.registry.versions)
        for v in infos:
            item = v.to_json()
            item.pop("files", None)
            if not with_token:
                item.pop("path", None)
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


@models_router.post(
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


@models_router.post(
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


class FailoverRequest(BaseModel):
    version: str | None = Field(
        None,
        max_length=256,
        pattern=_VERSION,
        description="the version to switch to (default: engine.backup_version)",
    )


@models_router.post(
    "/api/v1/models/failover", summary="Switch to the backup version (or the one given)",
    dependencies=[Depends(require_token)], response_model=DeployResult,
    responses={401: {"description": "token"}, 404: {"description": "unknown version"},
               409: {"description": "no backup version designated, or refused"}},
)  # fmt: skip
async def failover(request: Request, body: FailoverRequest | None = None) -> DeployResult:
    from infersight.engine.errors import DeployRefused

    runtime = _runtime(request)
    engine = get_service(request).config.engine
    version = (body.version if body is not None else None) or (engine.backup_version if engine else None)
    if not version:
        raise HTTPException(409, {"field": "body.version",
                                  "reason": "no backup version designated: give one, or set engine.backup_version"})  # fmt: skip
    if version not in runtime.registry:
        raise HTTPException(
            404, {"field": "body.version", "reason": f"version {version!r} is not registered"}
        )
    try:
        outcome = await run_in_threadpool(runtime.failover, version)
    except DeployRefused as exc:
        await run_in_threadpool(_flush_log, request)
        raise HTTPException(409, {"field": "body.version", "reason": f"failover refused: {exc}"}) from None
    await run_in_threadpool(_flush_log, request)
    return _outcome(outcome, "failed_over")


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


@models_router.get("/api/v1/models/canary", summary="The running canary, its traffic and its decisions")
async def canary_status(request: Request) -> CanaryResult:
    return _canary_result(request)


@models_router.post(
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


@models_router.post(
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


snapshots_router = APIRouter(tags=["snapshots"])


class SnapshotIn(BaseModel):
    reason: str = Field("taken by hand", min_length=1, max_length=1024)
    requests: int = Field(100, ge=1, le=10_000, description="how many of the latest requests to keep")


@snapshots_router.get(
    "/api/v1/snapshots", summary="Snapshots taken (newest first)", dependencies=[Depends(require_token)],
    responses={401: {"description": "token"}},
)  # fmt: skip
async def list_snapshots(request: Request, limit: int = Query(50, ge=1, le=500)) -> dict[str, Any]:
    service = get_service(request)

    def read() -> list[dict[str, Any]]:
        cols = [snapshots.c[n] for n in ("snapshot_id", "taken_at", "trigger", "reason", "model_version",
                                         "request_count", "path")]  # fmt: skip
        with service.db.connect() as conn:
            rows = conn.execute(select(*cols).order_by(snapshots.c.taken_at.desc()).limit(limit)).all()
        return [{**r._asdict(), "taken_at": json_time(r.taken_at)} for r in rows]

    return {"snapshots": await run_in_threadpool(read)}


@snapshots_router.get("/api/v1/snapshots/{snapshot_id}", summary="One snapshot's full content (prompts and answers)",
            dependencies=[Depends(require_token)],
            responses={401: {"description": "token"}, 404: {"description": "no such snapshot"}})  # fmt: skip
async def get_snapshot(snapshot_id: str, request: Request) -> Any:
    import json

    service = get_service(request)

    def read() -> Any:
        with service.db.connect() as conn:
            return conn.execute(
                select(snapshots.c.content).where(snapshots.c.snapshot_id == snapshot_id[:64])
            ).first()

    row = await run_in_threadpool(read)
    if row is None:
        raise HTTPException(404, {"field": "path.snapshot_id", "reason": "no such snapshot"})
    return json.loads(row.content)


@snapshots_router.post(
    "/api/v1/snapshots", summary="Take an inference snapshot now", dependencies=[Depends(require_token)],
    status_code=201, responses={401: {"description": "token"}},
)  # fmt: skip
async def take(request: Request, body: SnapshotIn | None = None) -> dict[str, Any]:
    from infersight.alerts import take_snapshot

    service = get_service(request)
    wiring = get_service(request).parts.alerts
    body = body or SnapshotIn(reason="taken by hand", requests=100)
    runtime = getattr(get_service(request).parts.backend, "runtime", None)
    if wiring is None:
        raise BackendUnavailable("alerting is disabled: snapshots need the alert engine's action")
    result = await run_in_threadpool(
        lambda: take_snapshot(
            service.db,
            data_dir=service.data_dir,
            requests_n=body.requests,
            trigger="manual",
            reason=body.reason,
            now=dt.datetime.now(dt.UTC),
            model_version=getattr(runtime, "serving_version", None),
            source=wiring.snapshot_source,
        )
    )
    return {"snapshot_id": result.snapshot_id, "request_count": result.request_count,
            "model_version": result.model_version, "html_path": str(result.html_path),
            "json_path": str(result.json_path)}  # fmt: skip


# one router for the app to include, the groups' tags kept on their endpoints
router = APIRouter()
for _part in (openai_router, models_router, snapshots_router):
    router.include_router(_part)
