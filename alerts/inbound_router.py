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

from .errors import InvalidAlertmanagerPayload
from .inbound import InboundResult

__all__ = ["ALERTMANAGER_PAYLOAD_SCHEMA", "InboundHandler", "alertmanager_router"]

_LABELS: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}
_STATUS: dict[str, Any] = {"type": "string", "enum": ["firing", "resolved"]}
# Alertmanager's webhook payload, version 4 (what parse_payload accepts), for the OpenAPI
# document: clients and the schema fuzzer see the real shape instead of an opaque body.
ALERTMANAGER_PAYLOAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["version", "groupKey", "receiver", "status", "groupLabels", "alerts"],
    "properties": {
        "version": {"type": "string", "enum": ["4"]},
        "groupKey": {"type": "string"},
        "truncatedAlerts": {"type": "integer", "minimum": 0},
        "receiver": {"type": "string"},
        "status": _STATUS,
        "groupLabels": _LABELS,
        "commonLabels": _LABELS,
        "commonAnnotations": _LABELS,
        "externalURL": {"type": "string"},
        "alerts": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["status", "labels", "startsAt", "fingerprint"],
                "properties": {
                    "status": _STATUS,
                    "labels": _LABELS,
                    "annotations": _LABELS,
                    "startsAt": {"type": "string", "format": "date-time"},
                    "endsAt": {"type": "string", "format": "date-time"},
                    "generatorURL": {"type": "string"},
                    "fingerprint": {"type": "string", "minLength": 1},
                },
            },
        },
    },
}


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

    @router.post(
        path,
        tags=["alerts"],
        summary="Alertmanager webhook receiver (payload version 4)",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ALERTMANAGER_PAYLOAD_SCHEMA}},
            }
        },
        responses={400: {"description": "malformed payload: the field and the reason"}},
    )
    async def receive(request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: [[[[...]]]]
            raise HTTPException(400, {"field": "body", "reason": f"not JSON: {exc}"}) from exc
        try:
            result = await run_in_threadpool(handler.handle, body)
        except InvalidAlertmanagerPayload as exc:
            raise HTTPException(400, {"field": exc.field, "reason": exc.reason}) from exc
        return result.to_json()

    return router
