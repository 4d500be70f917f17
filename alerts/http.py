"""The inbound Alertmanager webhook as a FastAPI router. The service mounts it (behind its
bearer-token dependency) at `POST /api/v1/alertmanager`; a malformed payload gets 400
with `{"detail": {"field": ..., "reason": ...}}`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from fastapi import APIRouter, HTTPException, Request
from fastapi.params import Depends
from starlette.concurrency import run_in_threadpool

from .alertmanager import InboundResult
from .errors import InvalidAlertmanagerPayload

__all__ = ["InboundHandler", "alertmanager_router"]


class InboundHandler(Protocol):
    """What the router calls: `AlertmanagerHandler`, or a service's lazy wrapper around one."""

    def handle(self, body: Any) -> InboundResult: ...


def alertmanager_router(
    handler: InboundHandler,
    *,
    path: str = "/api/v1/alertmanager",
    dependencies: Sequence[Depends] = (),
) -> APIRouter:
    router = APIRouter(dependencies=list(dependencies))

    @router.post(path, tags=["alerts"], summary="Alertmanager webhook receiver (payload version 4)")
    async def receive(request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HTTPException(400, {"field": "body", "reason": f"not JSON: {exc}"}) from exc
        try:
            result = await run_in_threadpool(handler.handle, body)
        except InvalidAlertmanagerPayload as exc:
            raise HTTPException(400, {"field": exc.field, "reason": exc.reason}) from exc
        return result.to_json()

    return router
