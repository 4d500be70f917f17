"""Data in and out: the SDK's batches in, a version's requests out as JSONL.

`POST /api/v1/events`: batched ingest of `InferenceRecord`s from remote SDKs.

Body `{"events": [record, ...]}`; answer `200 {"accepted": n, "rejected": [{"index", "field",
"reason"}]}`. Each record is validated by `InferenceRecord.from_json`; bad ones are listed
and the good ones kept (`from_json_many`: the same checks, in one pass). The answer comes once the accepted rows are committed (group
commit: concurrent batches share one transaction). A full write queue answers 503 with
Retry-After and accepts nothing. Parsing is orjson on the raw body: no per-event
pydantic model on the hot path; the schema below is for clients and the OpenAPI document.

`GET /api/v1/dataset?version=V[&kind=K][&since=T]` (bearer token: it returns user text):
the version's requests as JSONL, streamed, the same objects `infersight dataset export`
writes, with the service's `redact` hook applied. Bad input is a 422 naming the field."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import orjson
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse
from infersight.monitor.records import FINISH_REASONS, InferenceRecord, InvalidRecord, from_json_many
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from ..http_edge import require_token
from . import get_service

__all__ = ["router"]

ingest_router = APIRouter(tags=["ingest"])

_NUMBER = {"type": ["number", "null"], "minimum": 0}
_RECORD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["request_id", "model", "model_version", "started_at", "duration_s"],
    "properties": {
        "request_id": {"type": "string", "minLength": 1, "maxLength": 256},
        "model": {"type": "string", "minLength": 1, "maxLength": 256},
        "model_version": {"type": "string", "minLength": 1, "maxLength": 256},
        "started_at": {"type": "number", "minimum": 0},
        "duration_s": {"type": "number", "minimum": 0},
        "ttft_s": _NUMBER,
        "tpot_s": _NUMBER,
        "queue_s": _NUMBER,
        "prompt_tokens": {"type": ["integer", "null"], "minimum": 0},
        "output_tokens": {"type": ["integer", "null"], "minimum": 0},
        "error_type": {"type": ["string", "null"], "minLength": 1, "maxLength": 256},
        "prompt": {"type": ["string", "null"]},
        "response": {"type": ["string", "null"]},
        "source": {"type": "string", "enum": ["sdk", "engine", "proxy", "otlp"]},
        "path": {"type": ["string", "null"], "minLength": 1, "maxLength": 256},  # SLA routing's path
        "system_prompt": {"type": ["string", "null"]},  # a chat's system messages (optional)
        # the request's shape (optional): what the release checks compare like with like by
        "max_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": 2**31 - 1},
        "stream": {"type": ["boolean", "null"]},
        "finish_reason": {"type": ["string", "null"], "enum": [*sorted(FINISH_REASONS), None]},
    },
}
assert set(_RECORD_SCHEMA["properties"]) == {f.name for f in fields(InferenceRecord)}
_BODY_SCHEMA = {
    "type": "object",
    "required": ["events"],
    "properties": {"events": {"type": "array", "items": _RECORD_SCHEMA}},
}


class Rejection(BaseModel):
    index: int
    field: str
    reason: str


class IngestResult(BaseModel):
    accepted: int
    rejected: list[Rejection]


def _unprocessable(field: str, reason: str) -> HTTPException:
    return HTTPException(status_code=422, detail={"field": field, "reason": reason})


@ingest_router.post(
    "/api/v1/events",
    summary="Ingest a batch of observed inference calls",
    response_model=IngestResult,
    dependencies=[Depends(require_token)],
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": _BODY_SCHEMA}}}},
    responses={401: {"description": "missing or wrong token"}, 413: {"description": "body too large"},
               422: {"description": "not a batch"}, 503: {"description": "store behind; retry"}},
)  # fmt: skip
async def ingest(request: Request) -> Response:
    service = get_service(request)
    body = await request.body()
    lenient = False
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        payload = _lenient_json(body, exc)
        lenient = True
    if not isinstance(payload, dict):
        raise _unprocessable("body", 'must be a JSON object {"events": [...]}')
    events = payload.get("events")
    if not isinstance(events, list):
        raise _unprocessable("body.events", "must be a list of events")
    extra = sorted(k for k in payload if k != "events")
    if extra:
        raise _unprocessable(f"body.{_shown(extra[0])}", "unknown field")
    limit = service.config.limits.max_events_per_batch
    if len(events) > limit:
        raise _unprocessable("body.events", f"at most {limit} events per batch")
    records, refused = from_json_many(events, service.record_limits)
    if lenient:
        records, refused = _without_lone_surrogates(events, records, refused)
    rejected = [{"index": i, "field": _shown(exc.field), "reason": _shown(exc.reason)} for i, exc in refused]
    metrics = service.metrics
    assert service.pipeline is not None
    future = service.pipeline.submit(records)  # IngestOverloaded -> 503, nothing accepted
    try:
        await asyncio.wrap_future(future)
    except Exception:
        metrics.ingest_batches.labels("error").inc()
        raise
    metrics.ingest_batches.labels("ok").inc()
    metrics.ingest_events.labels("accepted").inc(len(records))
    if rejected:
        metrics.ingest_events.labels("rejected").inc(len(rejected))
    return Response(
        orjson.dumps({"accepted": len(records), "rejected": rejected}), media_type="application/json"
    )


def _lenient_json(body: bytes, strict_error: orjson.JSONDecodeError) -> Any:
    """The body orjson refused, read as Python's `json` reads it: `NaN`, `Infinity` and
    lone surrogate escapes (what `json.dumps` writes by default) become values, which the
    record checks then refuse by field, one event at a time, rather than the whole batch.
    Anything else orjson refused (invalid UTF-8, nesting past the recursion limit,
    truncation) stays a 422 for the body. Only taken when orjson failed: the hot path is
    untouched."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise _unprocessable("body", f"not valid JSON: {strict_error}") from None


def _without_lone_surrogates(
    events: list[Any], records: list[InferenceRecord], refused: list[tuple[int, InvalidRecord]]
) -> tuple[list[InferenceRecord], list[tuple[int, InvalidRecord]]]:
    """A leniently read batch less the records whose text is no UTF-8 (a lone surrogate,
    which no store can encode): each refused by the field that holds it."""
    refused_at = {i for i, _ in refused}
    kept: list[InferenceRecord] = []
    accepted = iter(records)
    for i in range(len(events)):
        if i in refused_at:
            continue
        record = next(accepted)
        bad = next((f.name for f in fields(record) if not _utf8(getattr(record, f.name))), None)
        if bad is None:
            kept.append(record)
        else:
            refused.append((i, InvalidRecord(bad, "not valid UTF-8 text (a lone surrogate)")))
    return kept, sorted(refused, key=lambda item: item[0])


def _shown(name: str) -> str:
    """A name from the body as an answer can carry it: an unknown field's name may hold a
    lone surrogate (read leniently), which no JSON encoder writes; it is shown escaped."""
    return name.encode("utf-8", "backslashreplace").decode("utf-8")


def _utf8(value: object) -> bool:
    if not isinstance(value, str):
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


dataset_router = APIRouter(tags=["dataset"])


@dataset_router.get(
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


# one router for the app to include, the groups' tags kept on their endpoints
router = APIRouter()
for _part in (ingest_router, dataset_router):
    router.include_router(_part)
