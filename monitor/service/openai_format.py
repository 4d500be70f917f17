"""Answers in the OpenAI wire format: whole responses, streamed chunks, SSE framing."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

__all__ = [
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "new_id",
    "sse",
    "usage",
]

SSE_DONE = b"data: [DONE]\n\n"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip


def completion_response(rid: str, model: str, text: str, finish: str, u: dict[str, int]) -> dict[str, Any]:
    return {
        "id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
        "usage": u,
    }  # fmt: skip


def completion_chunk(rid: str, model: str, text: str, finish: str | None) -> dict[str, Any]:
    return {
        "id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
    }  # fmt: skip


def chat_response(rid: str, model: str, text: str, finish: str, u: dict[str, int]) -> dict[str, Any]:
    return {
        "id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                     "logprobs": None}],
        "usage": u,
    }  # fmt: skip


def chat_chunk(rid: str, model: str, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }  # fmt: skip


def usage_chunk(rid: str, model: str, obj: str, u: dict[str, int]) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [], "usage": u}
