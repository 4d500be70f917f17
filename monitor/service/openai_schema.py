"""Request bodies of `/v1/completions` and `/v1/chat/completions`.

The embedded runtime validates with `CompletionRequest` / `ChatRequest` (the OpenAI API
subset it serves; unknown parameters are ignored, as OpenAI-compatible servers do).

The upstream proxy validates nothing it does not need: it forwards the original body
untouched and reads only what it observes (`ObservedRequest`: the model name, the prompt
text when there is one). Token-id prompts, any number of `stop` strings, `tools` and
`function` messages, extra fields and values outside OpenAI's documented ranges all reach
the upstream, whose own answer (200 or 4xx) goes back to the client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "ContentPart",
    "ObservedRequest",
    "StreamOptions",
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

    @classmethod
    def completion(cls, body: dict[str, Any]) -> ObservedRequest:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        return cls(_model(body), prompt if isinstance(prompt, str) else None)  # token ids: no text to keep

    @classmethod
    def chat(cls, body: dict[str, Any]) -> ObservedRequest:
        messages = body.get("messages")
        dicts = [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
        users = [m for m in dicts if m.get("role") == "user"] or dicts[-1:]
        return cls(_model(body), _text(users[-1].get("content")) if users else None)

    def prompt_text(self) -> str | None:
        return self.prompt

    def last_user_text(self) -> str | None:
        return self.prompt


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
