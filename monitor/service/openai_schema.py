"""Request bodies of `/v1/completions` and `/v1/chat/completions` (the OpenAI API subset
infersight understands). Unknown parameters are ignored, as OpenAI-compatible servers do,
so any client works; the upstream proxy forwards the original body untouched."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ChatMessage", "ChatRequest", "CompletionRequest", "ContentPart", "StreamOptions"]

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


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str = Field(max_length=64)
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
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
