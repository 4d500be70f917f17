"""OpenAI-compatible `/v1/completions`, `/v1/chat/completions` (SSE streaming with
`"stream": true`) and `/v1/models`, served by the embedded runtime or the upstream proxy.

Inference does not change the service's state, so these take no infersight token; in
proxy mode the client's own `Authorization` header goes to the upstream.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..errors import BackendUnavailable
from ..openai_schema import ChatRequest, CompletionRequest
from ._deps import component

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
    backend = component(request, "backend")
    if backend is None:
        raise BackendUnavailable("no model is served here: start with an engine registry or --upstream URL")
    return backend


@router.post("/v1/completions", summary="Text completion (OpenAI API)", responses=_RESPONSES)
async def completions(body: CompletionRequest, request: Request) -> Response:
    raw = await request.body()
    result: Response = await _backend(request).completion(body, raw, request.headers)
    return result


@router.post("/v1/chat/completions", summary="Chat completion (OpenAI API)", responses=_RESPONSES)
async def chat_completions(body: ChatRequest, request: Request) -> Response:
    raw = await request.body()
    result: Response = await _backend(request).chat(body, raw, request.headers)
    return result


@router.get(
    "/v1/models", summary="Models served (OpenAI API)", responses={503: {"description": "no backend"}}
)
async def list_models(request: Request) -> Response:
    result = await _backend(request).models()
    return result if isinstance(result, Response) else JSONResponse(result)
