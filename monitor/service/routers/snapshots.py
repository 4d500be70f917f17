"""`GET /api/v1/snapshots` (newest first), `GET /api/v1/snapshots/{id}` (its full content:
prompts and answers) and `POST /api/v1/snapshots` (take an inference snapshot now, the same
action the alert rules run). All three need the bearer token: snapshots hold user text."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from infersight.monitor.store.tables import snapshots
from pydantic import BaseModel, Field
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from ..errors import BackendUnavailable
from ..security import require_token
from ._deps import get_service

__all__ = ["router"]

router = APIRouter(tags=["snapshots"])


class SnapshotIn(BaseModel):
    reason: str = Field("taken by hand", min_length=1, max_length=1024)
    requests: int = Field(100, ge=1, le=10_000, description="how many of the latest requests to keep")


def _iso(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


@router.get(
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
        return [{**r._asdict(), "taken_at": _iso(r.taken_at)} for r in rows]

    return {"snapshots": await run_in_threadpool(read)}


@router.get("/api/v1/snapshots/{snapshot_id}", summary="One snapshot's full content (prompts and answers)",
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


@router.post(
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
