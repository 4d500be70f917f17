"""`GET /api/v1/drift` (latest report summaries and the stored references),
`GET /api/v1/drift/{report_id}` (bearer token: the full report as `DriftReport.to_json()`
gives it, whose explanation quotes prompts and answers) and
`POST /api/v1/drift/evaluate` (bearer token: run the batch test now)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from starlette.concurrency import run_in_threadpool

from ..errors import BackendUnavailable
from ..security import require_token
from ._deps import get_service

__all__ = ["router"]

router = APIRouter(tags=["drift"])


def _drift(request: Request) -> Any:
    wiring = get_service(request).parts.drift
    if wiring is None:
        raise BackendUnavailable("drift scoring is disabled in this service's config")
    return wiring


@router.get("/api/v1/drift", summary="Latest drift reports (summaries) and references")
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


@router.get(
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


@router.post(
    "/api/v1/drift/evaluate", summary="Run the batch drift test now on every active model version",
    dependencies=[Depends(require_token)], responses={401: {"description": "token"}},
)  # fmt: skip
async def evaluate_now(request: Request) -> dict[str, Any]:
    wiring = _drift(request)
    reports = await run_in_threadpool(lambda: wiring.evaluate(force=True))
    return {"reports": [r.summary_json() for r in reports]}
