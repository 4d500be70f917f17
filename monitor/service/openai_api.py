"""The OpenAI-compatible surface: request bodies, answers and SSE in the OpenAI wire format,
the chat template and streaming detokenization.

Request bodies of `/v1/completions` and `/v1/chat/completions`.

The embedded runtime validates with `CompletionRequest` / `ChatRequest` (the OpenAI API
subset it serves; unknown parameters are ignored, as OpenAI-compatible servers do).

The upstream proxy validates nothing it does not need: it forwards the original body
untouched and reads only what it observes (`ObservedRequest`: the model name, the prompt
text when there is one). Token-id prompts, any number of `stop` strings, `tools` and
`function` messages, extra fields and values outside OpenAI's documented ranges all reach
the upstream, whose own answer (200 or 4xx) goes back to the client.

Answers in the OpenAI wire format: whole responses, streamed chunks, SSE framing.

The chat template of the embedded runtime, documented because the demo model and any
user checkpoint without a template of its own are prompted with it:

    <role>: <content>\\n        one line per message, in order (system, user, assistant, ...)
    assistant:                  the model continues from here

Roles are written as given (`system`, `user`, `assistant`, `tool`, `function`, `developer`).
Upstream servers (proxy mode) apply their own template; this one is not used there.

Streaming detokenization with stop strings: text is released only when no stop string
can still begin in it, and never ends in half a character (U+FFFD)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "ContentPart",
    "ObservedRequest",
    "StreamOptions",
    "TextStream",
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "new_id",
    "render_chat",
    "sse",
    "usage",
]

_Stop = Annotated[str, Field(min_length=1, max_length=256)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(
        None, max_length=256, description="the served version (any value in proxy mode)"
    )
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=128, description="the embedded runtime serves n=1 only")
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: _Stop | Annotated[list[_Stop], Field(max_length=4)] | None = None
    user: str | None = Field(None, max_length=256)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_Sampling):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=64)]
    max_tokens: int | None = Field(16, ge=1, le=1_000_000)
    echo: bool = False

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


MAX_SYSTEM_CHARS = 8192  # a chat's system messages kept in its record (beyond: cut)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str = Field(max_length=64)
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = Field(None, max_length=256)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content if p.type == "text")


class ChatRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=1024)]
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)

    def token_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.role == "user":
                return message.text()
        return self.messages[-1].text()

    def system_text(self) -> str | None:
        """The system (and developer) messages before the last user message, joined by newlines
        and cut at `MAX_SYSTEM_CHARS`; None when there are none. Earlier turns are left out: what
        the record keeps is the part many requests share (the prefix cache's preload reads it)."""
        users = [i for i, m in enumerate(self.messages) if m.role == "user"]
        before = self.messages[: users[-1]] if users else self.messages[:-1]
        texts = [m.text() for m in before if m.role in ("system", "developer")]
        joined = "\n".join(t for t in texts if t)
        return joined[:MAX_SYSTEM_CHARS] or None


_MAX_OBSERVED = 256  # model names longer than a label may be are cut (the record's own limit)


@dataclass(frozen=True)
class ObservedRequest:
    """What the proxy reads of a body it forwards as is; never refuses a JSON object."""

    model: str | None
    prompt: str | None  # the completion prompt or the last user message, when it is text
    max_tokens: int | None = None  # the request's shape, when the body says it
    stream: bool | None = None

    @classmethod
    def completion(cls, body: dict[str, Any]) -> ObservedRequest:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        text = prompt if isinstance(prompt, str) else None  # token ids: no text to keep
        return cls(_model(body), text, *_shape(body))

    @classmethod
    def chat(cls, body: dict[str, Any]) -> ObservedRequest:
        messages = body.get("messages")
        dicts = [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
        users = [m for m in dicts if m.get("role") == "user"] or dicts[-1:]
        return cls(_model(body), _text(users[-1].get("content")) if users else None, *_shape(body))

    def prompt_text(self) -> str | None:
        return self.prompt

    def last_user_text(self) -> str | None:
        return self.prompt


def _shape(body: dict[str, Any]) -> tuple[int | None, bool | None]:
    """(max_tokens, stream) as the body asks, None where it does not say (or says nonsense)."""
    budget = body.get("max_completion_tokens", body.get("max_tokens"))
    ok = type(budget) is int and 1 <= budget < 2**31
    stream = body.get("stream", False)
    return (budget if ok else None), (stream if isinstance(stream, bool) else None)


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    return model[:_MAX_OBSERVED] if isinstance(model, str) and model else None


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(p for p in parts if isinstance(p, str))
    return None


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


def render_chat(messages: Sequence[ChatMessage]) -> str:
    lines = [f"{m.role}: {m.text()}" for m in messages]
    lines.append("assistant:")
    return "\n".join(lines)


class TextStream:
    """The text of a generation as its tokens arrive, decoded a few tokens at a time.

    Each token decodes a window of the last few ids, not the whole answer (the way vLLM's
    incremental detokenizer does): the text of `ids[prefix:]` less the text of
    `ids[prefix:read]` is what the new token added, so leading-space and word-piece rules
    that depend on the first token of a decode cancel out. A token that ends inside a UTF-8
    character (the decode ends in U+FFFD) adds nothing until the character is complete. The
    cost per token is bounded by the window, not by the answer's length, so a long streamed
    answer does not grow quadratically on the event loop.
    """

    WINDOW = 64  # ids decoded at most per token; beyond it a run of incomplete bytes is let out

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._ids: list[int] = []
        self._prefix = 0  # the window's first id: context for the next decode
        self._read = 0  # ids up to here are in `text`
        self._emitted = 0
        self.text = ""
        self.stopped = False  # a stop string was found; the text ends before it

    def push(self, token_id: int) -> str:
        """Add a token; the newly releasable text ("" when nothing can be released yet)."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        self._advance(final=False)
        return self._after_growth()

    def _advance(self, *, final: bool) -> None:
        """Decode what the ids since `read` add to the text (all of it when `final`)."""
        ids = self._ids
        if self._read == len(ids):
            return
        before = self._decode(ids[self._prefix : self._read]) if self._read > self._prefix else ""
        after = self._decode(ids[self._prefix :])
        pending = len(ids) - self._prefix > self.WINDOW
        if (after.endswith("\ufffd") or len(after) <= len(before)) and not (final or pending):
            return  # a character split across tokens, or a token with no text: keep the context
        if len(after) > len(before) and after.startswith(before):
            self.text += after[len(before) :]
        elif after != before:  # a decoder that rewrote the context: take the new ids alone
            self.text += self._decode(ids[self._read :])
        self._prefix, self._read = self._read, len(ids)

    def _after_growth(self) -> str:
        self._find_stop()
        return self._release(len(self.text) if self.stopped else len(self.text) - self._hold)

    def _find_stop(self) -> None:
        for stop in self._stops:
            at = self.text.find(stop, max(0, self._emitted - len(stop)))
            if at != -1:
                self.stopped = True
                self.text = self.text[:at]
                return

    @property
    def has_stops(self) -> bool:
        """Stop strings to look for: then each token is decoded as it comes."""
        return bool(self._stops)

    @property
    def ids(self) -> list[int]:
        return self._ids

    def hold(self, token_id: int) -> None:
        """Add a token without decoding: a whole answer without stop strings is decoded once,
        at the end (`settle`), not once per token."""
        self._ids.append(token_id)

    def settle(self, text: str) -> None:
        """The decoded text of the held tokens."""
        self.text = text
        self._prefix = self._read = len(self._ids)

    def flush(self) -> str:
        """The rest of the text at the end of generation."""
        if not self.stopped:
            self._advance(final=True)
            self._find_stop()
        return self._release(len(self.text))

    @property
    def token_count(self) -> int:
        return len(self._ids)

    def _release(self, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        chunk = self.text[self._emitted : upto]
        self._emitted = upto
        return chunk
