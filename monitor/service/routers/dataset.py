"""`GET /api/v1/dataset?version=V[&kind=K][&since=T]` (bearer token: it returns user text):
the version's requests as JSONL, streamed, the same objects `infersight dataset export`
writes, with the service's `redact` hook applied. Bad input is a 422 naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..security import require_token
from ._deps import get_service

__all__ = ["router"]

router = APIRouter(tags=["dataset"])


@router.get(
    "/api/v1/dataset", summary="A version's requests as JSONL (prompt, answer, relevance, drift flags)",
    dependencies=[Depends(require_token)],
    responses={401: {"description": "token"}, 422: {"description": "unknown kind, bad since"}},
    response_class=StreamingResponse,
)  # fmt: skip
async def export(
    request: Request,
    version: str = Query(..., min_length=1, max_length=256, description="model version"),
    kind: str | None = Query(None, description="drifted, novel, failed, snapshot or collected"),
    since: str | None = Query(None, max_length=64, description="ISO 8601 time or a duration such as 2h"),
) -> StreamingResponse:
    from infersight.monitor.dataset import DatasetError, DatasetQuery, iter_dataset, parse_since

    service = get_service(request)
    try:
        query = DatasetQuery(version, kind or None, parse_since(since) if since else None)
    except DatasetError as exc:
        raise HTTPException(422, {"field": f"query.{exc.field}", "reason": str(exc)}) from exc
    rows = iter_dataset(service.db, query, redact=service.redactor)
    first = await run_in_threadpool(next, rows, None)  # database errors answer before the 200

    def lines() -> Iterator[bytes]:
        if first is None:
            return
        yield (json.dumps(first, ensure_ascii=False) + "\n").encode()
        for obj in rows:
            yield (json.dumps(obj, ensure_ascii=False) + "\n").encode()

    return StreamingResponse(lines(), media_type="application/jsonl",
                             headers={"Cache-Control": "no-store"})  # fmt: skip
