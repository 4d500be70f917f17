"""OpenTelemetry in: `POST /v1/traces`, the OTLP/HTTP trace receiver.

Any OTLP exporter (an app instrumented with OpenLLMetry or OpenInference, vLLM's
`--otlp-traces-endpoint`, an OpenTelemetry Collector's `otlphttp` exporter) points here.
Bodies are `application/x-protobuf` or `application/json` (OTLP's JSON mapping: hex trace
and span ids), optionally `Content-Encoding: gzip`, parsed with the official
`opentelemetry-proto` messages. The bearer token is ingest's (exporters send it with
`OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20<token>`), and so is the body limit,
which also bounds a gzip body once inflated.

The GenAI spans become `InferenceRecord`s with source `otlp` (otlp_spans.py) and take
ingest's path: the same pipeline, observers and group commit, answered once the rows are
committed. A full write queue or a failed commit is 503 with `Retry-After` (OTLP exporters
retry it) and nothing of the export is kept; a retried export's spans are not stored twice
(their ids make the request ids). Answers are OTLP's, in the request's format:
`ExportTraceServiceResponse`, with `partial_success` counting the model-call spans that
could not be records and why; a body that is not an export is 400 with a `google.rpc.Status`."""

from __future__ import annotations

import asyncio
import binascii
import datetime as dt
import json
import zlib
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2, status_pb2
from infersight.monitor.business import Feedback, store_feedback
from infersight.monitor.records import DEFAULT_LIMITS, RecordLimits
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

from ..errors import IngestOverloaded
from ..http_edge import has_token
from ..metrics import ServiceMetrics
from ..otlp_feedback import feedback_from_spans
from ..otlp_spans import SpanBatch, TextPolicy, records_from_spans
from . import get_service

__all__ = ["StatusBodies", "router"]

router = APIRouter(tags=["otlp"])

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})
_RETRY_AFTER_S = "1"


class _Refused(Exception):
    """An export answered with a `google.rpc.Status` (and nothing of it kept)."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@router.post("/v1/traces", include_in_schema=False)
async def export_traces(request: Request) -> Response:
    service = get_service(request)
    metrics = service.metrics
    media = JSON if _media(request) == JSON else PROTOBUF
    if not has_token(request):
        metrics.otlp_exports.labels("unauthorized").inc()
        return _status(media, 401, code_pb2.UNAUTHENTICATED, "a valid bearer token is required",
                       {"WWW-Authenticate": 'Bearer realm="infersight"'})  # fmt: skip
    body = await request.body()
    policy = TextPolicy(service.config.text_sample_rate, service.redactor)
    limit = service.config.limits.max_body_bytes
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    try:
        batch, evaluations = await run_in_threadpool(
            _decode_and_map, body, encoding, media, limit, policy, service.record_limits
        )
    except _Refused as exc:
        metrics.otlp_exports.labels("invalid").inc()
        return _status(media, exc.status, exc.code, exc.message)
    assert service.pipeline is not None
    try:
        future = service.pipeline.submit(batch.records)
        await asyncio.wrap_future(future)
    except Exception as exc:  # IngestOverloaded, or the commit failed: nothing kept, retry
        metrics.otlp_exports.labels("overloaded").inc()
        why = str(exc) if isinstance(exc, IngestOverloaded) else "the store is unavailable; retry later"
        return _status(media, 503, code_pb2.UNAVAILABLE, why, {"Retry-After": _RETRY_AFTER_S})
    _count(service.metrics, batch)
    if evaluations:  # the GenAI evaluation results: users' (or judges') feedback on requests
        now = dt.datetime.fromtimestamp(service.clock(), dt.UTC)
        await run_in_threadpool(store_feedback, service.db, evaluations, source="otlp", now=now)
    answer = ExportTraceServiceResponse()
    if batch.rejected_spans:
        answer.partial_success.CopyFrom(
            ExportTracePartialSuccess(
                rejected_spans=batch.rejected_spans, error_message=batch.error_message()
            )
        )
    return _answer(media, 200, answer)


def _media(request: Request) -> str:
    return request.headers.get("content-type", PROTOBUF).partition(";")[0].strip().lower()


def _decode_and_map(
    body: bytes,
    encoding: str,
    media: str,
    limit: int,
    policy: TextPolicy,
    limits: RecordLimits = DEFAULT_LIMITS,
) -> tuple[SpanBatch, list[Feedback]]:
    export = _parse(_inflate(body, encoding, limit), media)
    return records_from_spans(export, policy, limits), feedback_from_spans(export)


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    if encoding in ("identity", ""):
        return body
    if encoding not in ("gzip", "deflate"):
        raise _Refused(
            415, code_pb2.INVALID_ARGUMENT, f"Content-Encoding {encoding[:40]!r}: gzip, deflate or none"
        )
    inflater = zlib.decompressobj(zlib.MAX_WBITS | (16 if encoding == "gzip" else 32))
    try:
        raw = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise _Refused(400, code_pb2.INVALID_ARGUMENT, f"the body is not valid {encoding}: {exc}") from None
    if len(raw) > limit or inflater.unconsumed_tail:
        raise _Refused(413, code_pb2.RESOURCE_EXHAUSTED, f"the inflated body is larger than {limit} bytes")
    # zlib raises only on bytes it cannot read: a stream cut short (a gzip header and no
    # end) inflates to whatever came before the cut, and would pass for an empty export
    if not inflater.eof:
        raise _Refused(400, code_pb2.INVALID_ARGUMENT, f"the body is not valid {encoding}: truncated")
    if inflater.unused_data:
        raise _Refused(
            400, code_pb2.INVALID_ARGUMENT, f"the body is not valid {encoding}: bytes after its end"
        )
    return raw


def _parse(raw: bytes, media: str) -> ExportTraceServiceRequest:
    export = ExportTraceServiceRequest()
    if media == PROTOBUF:
        try:
            export.ParseFromString(raw)
        except (DecodeError, ValueError, RuntimeError) as exc:  # RuntimeError: upb's recursion limit
            raise _Refused(
                400, code_pb2.INVALID_ARGUMENT, f"not an OTLP ExportTraceServiceRequest: {exc}"
            ) from None
        return export
    try:
        # orjson, not json: it refuses what OTLP/JSON cannot hold (lone surrogate escapes,
        # NaN) and nesting past its limit as the bad JSON they are
        obj = orjson.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError("the body must be a JSON object")
        json_format.ParseDict(_ids_as_base64(obj), export, ignore_unknown_fields=True)
    except (ValueError, RecursionError, json_format.ParseError) as exc:
        message = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise _Refused(
            400, code_pb2.INVALID_ARGUMENT, f"not an OTLP/JSON ExportTraceServiceRequest: {message}"
        ) from None
    return export


def _ids_as_base64(obj: Any) -> Any:
    """OTLP/JSON writes trace and span ids in hex, where protobuf's JSON mapping of `bytes`
    expects base64: the ids are converted before `ParseDict`."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if key in _ID_KEYS and isinstance(value, str):
                try:
                    value = binascii.b2a_base64(bytes.fromhex(value), newline=False).decode()
                except ValueError:
                    raise ValueError(f"{key}: {value[:40]!r} is not a hex id") from None
            else:
                value = _ids_as_base64(value)
            out[key] = value
        return out
    if isinstance(obj, list):
        return [_ids_as_base64(v) for v in obj]
    return obj


def _count(metrics: ServiceMetrics, batch: SpanBatch) -> None:
    metrics.otlp_exports.labels("partial" if batch.rejected_spans else "ok").inc()
    if batch.records:
        metrics.otlp_spans.labels("accepted").inc(len(batch.records))
    for reason, n in (*batch.skipped.items(), *batch.rejected.items()):
        metrics.otlp_spans.labels(reason).inc(n)
    for reason, n in batch.finish_reasons.items():
        metrics.otlp_finish_reasons.labels(reason).inc(n)


def _status(
    media: str, http: int, code: int, message: str, headers: dict[str, str] | None = None
) -> Response:
    return _answer(media, http, status_pb2.Status(code=code, message=message), headers)


def _answer(media: str, http: int, message: Message, headers: dict[str, str] | None = None) -> Response:
    if media == JSON:
        body = json_format.MessageToJson(message, indent=None).encode()
    else:
        body = message.SerializeToString()
    return Response(body, status_code=http, media_type=media, headers=headers)


# the HTTP status of an answer the shared edge made (a 413 before the body was read, a 429 from
# the rate limit, a 405) as the gRPC code OTLP/HTTP exporters read from its Status
_CODES = {400: code_pb2.INVALID_ARGUMENT, 401: code_pb2.UNAUTHENTICATED, 403: code_pb2.PERMISSION_DENIED,
          404: code_pb2.NOT_FOUND, 405: code_pb2.UNIMPLEMENTED, 413: code_pb2.RESOURCE_EXHAUSTED,
          415: code_pb2.INVALID_ARGUMENT, 429: code_pb2.RESOURCE_EXHAUSTED, 503: code_pb2.UNAVAILABLE}  # fmt: skip
_KEPT_HEADERS = frozenset({b"retry-after", b"www-authenticate"})


class StatusBodies:
    """ASGI middleware, outermost: every error answer on `/v1/traces` is a `google.rpc.Status`
    in the request's format, as OTLP/HTTP says, including those the shared edge makes before
    the route runs (the body size limit, the rate limit, a wrong method), which are JSON
    `{"error": ...}` everywhere else. The route's own answers pass through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") != "/v1/traces":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers", ())).get(b"content-type", b"")
        media = JSON if given.partition(b";")[0].strip().lower() == JSON.encode() else PROTOBUF
        start: AsgiMessage | None = None
        chunks: list[bytes] = []

        async def rewriting_send(message: AsgiMessage) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until its body is in, to see whose answer it is
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                await _send_error(send, start, b"".join(chunks), media)

        await self.app(scope, receive, rewriting_send)


async def _send_error(send: Send, start: AsgiMessage, body: bytes, media: str) -> None:
    """The held error answer as it was when it is the route's own Status, else as a Status."""
    http = int(start["status"])
    types = [v for k, v in start.get("headers", ()) if k == b"content-type"]
    answered = types[0].partition(b";")[0].strip().decode("latin-1") if types else ""
    try:
        shaped = json.loads(body) if answered == JSON else None
    except (ValueError, RecursionError):
        shaped = None
    error = shaped.get("error") if isinstance(shaped, dict) else None  # the edge's {"error": {...}}
    if answered == media and not isinstance(error, dict):
        await send(start)
        await send({"type": "http.response.body", "body": body})
        return
    message = str(error.get("message")) if isinstance(error, dict) else body.decode("utf-8", "replace")[:300]
    code = _CODES.get(http, code_pb2.INVALID_ARGUMENT if http < 500 else code_pb2.INTERNAL)
    status = status_pb2.Status(code=code, message=message or f"HTTP {http}")
    out = (
        json_format.MessageToJson(status, indent=None).encode()
        if media == JSON
        else status.SerializeToString()
    )
    headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() in _KEPT_HEADERS]
    headers += [(b"content-type", media.encode()), (b"content-length", str(len(out)).encode())]
    await send({"type": "http.response.start", "status": http, "headers": headers})
    await send({"type": "http.response.body", "body": out})
