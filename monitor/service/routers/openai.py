"""OpenAI-compatible `/v1/completions`, `/v1/chat/completions` (SSE streaming with
`"stream": true`) and `/v1/models`, served by the embedded runtime or the upstream proxy.

Inference does not change the service's state, so these take no infersight token; in
proxy mode the client's own `Authorization` header goes to the upstream.

The body is read here and validated by what serves it: the embedded runtime checks the
OpenAI subset it serves (`CompletionRequest`, `ChatRequest`); the proxy only needs a JSON
object and forwards it byte for byte (`ObservedRequest`), so the upstream decides.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from ..errors import BackendUnavailable
from ..openai_schema import ChatRequest, CompletionRequest, ObservedRequest
from ._deps import get_service

__all__ = ["router"]

router = APIRouter(tags=["openai"])

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


@router.post("/v1/completions", summary="Text completion (OpenAI API)", responses=_RESPONSES,
             openapi_extra=_body_doc(CompletionRequest))  # fmt: skip
async def completions(request: Request) -> Response:
    raw = await request.body()  # first: an oversize body is a 413 whatever serves it
    backend = _backend(request)
    body = _json_object(raw)
    req = ObservedRequest.completion(body) if _proxying(backend) else _validated(CompletionRequest, body)
    result: Response = await backend.completion(req, raw, request.headers)
    return result


@router.post("/v1/chat/completions", summary="Chat completion (OpenAI API)", responses=_RESPONSES,
             openapi_extra=_body_doc(ChatRequest))  # fmt: skip
async def chat_completions(request: Request) -> Response:
    raw = await request.body()  # first: an oversize body is a 413 whatever serves it
    backend = _backend(request)
    body = _json_object(raw)
    req = ObservedRequest.chat(body) if _proxying(backend) else _validated(ChatRequest, body)
    result: Response = await backend.chat(req, raw, request.headers)
    return result


@router.get(
    "/v1/models", summary="Models served (OpenAI API)", responses={503: {"description": "no backend"}}
)
async def list_models(request: Request) -> Response:
    result = await _backend(request).models()
    return result if isinstance(result, Response) else JSONResponse(result)
