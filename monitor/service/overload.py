"""Keeping the event loop free and the sockets bounded under overload and hostile input.

One event loop answers every route (`/healthz`, `/metrics`, the page, `/v1`): CPU work on it
stalls them all. Two things here keep it free:

- `PromptEncoder`: a prompt's work is bounded before it is tokenized, and the tokenizing
  runs off the loop. A prompt of more characters than `max_prompt_tokens` tokens can span
  (the tokenizer's longest token, in characters, times the limit: `max_prompt_chars`) is
  refused at once (`PromptOverCharacters`, the service's 400) without tokenizing any of it;
  a 7 MB prompt costs a `len()`. Below the bound, a long prompt is tokenized in a small pool
  of threads through `encode_batch` (which releases the GIL, so the loop runs meanwhile: a
  plain `encode` holds it), a bounded number at a time; a short one inline (a thread hop
  would cost more than tokenizing it).
- `ConnectionGuard`: the HTTP protocol `infersight serve` runs (uvicorn's httptools one)
  with a header-read timeout (a connection whose request headers are not complete within
  `header_timeout_s` of its first byte, or of its opening, is closed: uvicorn has none) and
  a cap on the connections open at once from one client address (over it, a new connection
  is closed at once). So 500 half-open connections cost 500 timers and are gone after the
  timeout, and one address cannot hold every socket.

What a tokenizer's "longest token" is: the longest vocabulary entry, in characters (an upper
bound on the text one token stands for, as byte-level entries spell a byte per character),
and for WordPiece the longest word it maps to one unknown token (`max_input_chars_per_word`).
A normalizer that drops characters (whitespace, accents) makes a prompt over the bound
tokenize to fewer tokens: such a prompt is refused too; the bound is stated in the error.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["ConnectionGuard", "PromptEncoder", "PromptOverCharacters", "max_token_chars", "server_options"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_INLINE_CHARS = 2048  # prompts up to this are tokenized on the loop: a thread hop costs more
_WORDPIECE_UNK_CHARS = 100  # WordPiece's default max_input_chars_per_word
_UNBOUNDED_WORD_CHARS = 100  # WordLevel maps any unknown word to one token: assume words this long


class PromptOverCharacters(ValueError):
    """A prompt longer, in characters, than `max_prompt_tokens` tokens of this tokenizer can
    span: refused before tokenizing (the service's 400, `context_length_exceeded`)."""

    def __init__(self, chars: int, limit: int, max_prompt_tokens: int) -> None:
        super().__init__(
            f"prompt of {chars} characters is over max_prompt_chars={limit} "
            f"(max_prompt_tokens={max_prompt_tokens} tokens of this tokenizer span at most {limit} characters)"
        )
        self.chars = chars
        self.limit = limit


def max_token_chars(tokenizer: Any) -> int:
    """The most characters of text one token of `tokenizer` (a `tokenizers.Tokenizer`) stands for."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    longest = max((len(piece) for piece in vocab), default=1)
    try:
        model = json.loads(tokenizer.to_str()).get("model", {})
    except Exception:  # a tokenizer that cannot describe itself: the vocabulary's bound
        return max(1, longest)
    kind = model.get("type")
    if kind == "WordPiece":
        return max(longest, int(model.get("max_input_chars_per_word") or _WORDPIECE_UNK_CHARS))
    if kind == "WordLevel":
        return max(longest, _UNBOUNDED_WORD_CHARS)
    return max(1, longest)


class PromptEncoder:
    """Tokenizes prompts within `max_prompt_tokens`' character bound, off the event loop.
    `workers` threads tokenize; at most `max_pending` prompts wait for them at once (more
    wait on the loop, costing nothing). `close()` ends the threads."""

    def __init__(self, max_prompt_tokens: int, *, workers: int = 2, max_pending: int = 16) -> None:
        self.max_prompt_tokens = max_prompt_tokens
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="infersight-tokenize")
        self._max_pending = max_pending
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None  # per event loop
        self._bound: tuple[Any, int] | None = None  # (tokenizer, max_prompt_chars): one per version

    def max_prompt_chars(self, tokenizer: Any) -> int:
        """The character bound for `tokenizer` (computed once per tokenizer: at each deploy)."""
        bound = self._bound
        if bound is None or bound[0] is not tokenizer:
            bound = (tokenizer, self.max_prompt_tokens * max_token_chars(tokenizer))
            self._bound = bound
        return bound[1]

    async def encode(self, tokenizer: Any, text: str) -> list[int]:
        """`text`'s token ids (no special tokens); raises PromptOverCharacters first when it is
        longer than any prompt of `max_prompt_tokens` tokens can be."""
        if self._bound is None or self._bound[0] is not tokenizer:
            await self.run(self.max_prompt_chars, tokenizer)  # reads the vocabulary: off the loop too
        limit = self.max_prompt_chars(tokenizer)
        if len(text) > limit:
            raise PromptOverCharacters(len(text), limit, self.max_prompt_tokens)
        if len(text) <= _INLINE_CHARS:
            return list(tokenizer.encode(text, add_special_tokens=False).ids)
        encoded = await self.run(tokenizer.encode_batch, [text], add_special_tokens=False)
        return list(encoded[0].ids)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on the pool, at most `max_pending` at a time."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self._max_pending))
        async with self._slots[1]:
            return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class ConnectionGuard:
    """Bounds on the connections of one `infersight serve` process: `protocol()` is the HTTP
    protocol class to give uvicorn (`http=`). `closed_idle` and `refused` count the
    connections closed for a slow header and those refused over the per-address cap."""

    def __init__(self, *, header_timeout_s: float, max_per_client: int) -> None:
        if not header_timeout_s > 0 or max_per_client < 1:
            raise ValueError("header_timeout_s must be > 0 and max_per_client >= 1")
        self.header_timeout_s = header_timeout_s
        self.max_per_client = max_per_client
        self.open: dict[str, int] = {}  # client address -> connections open (loop thread only)
        self.closed_idle = 0
        self.refused = 0

    def protocol(self) -> type[Any]:
        """uvicorn's httptools protocol, guarded by this object."""
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        guard = self

        class GuardedHttpToolsProtocol(HttpToolsProtocol):
            connection_guard = guard
            _guard_addr: str | None = None
            _header_timer: asyncio.TimerHandle | None = None

            def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
                super().connection_made(transport)
                addr = self.client[0] if self.client else None
                if addr is not None and guard.open.get(addr, 0) >= guard.max_per_client:
                    guard.refused += 1
                    transport.close()  # connection_lost follows; nothing was counted for it
                    return
                if addr is not None:
                    self._guard_addr = addr
                    guard.open[addr] = guard.open.get(addr, 0) + 1
                self._arm()  # the first request's headers must come within the timeout

            def connection_lost(self, exc: Exception | None) -> None:
                self._disarm()
                addr, self._guard_addr = self._guard_addr, None
                if addr is not None:
                    left = guard.open.get(addr, 1) - 1
                    if left > 0:
                        guard.open[addr] = left
                    else:
                        guard.open.pop(addr, None)
                super().connection_lost(exc)

            def on_message_begin(self) -> None:
                super().on_message_begin()
                if self._header_timer is None:
                    self._arm()  # a keep-alive connection's next request: its headers timed too

            def on_headers_complete(self) -> None:
                self._disarm()
                super().on_headers_complete()

            def _arm(self) -> None:
                self._disarm()
                self._header_timer = self.loop.call_later(guard.header_timeout_s, self._too_slow)

            def _disarm(self) -> None:
                if self._header_timer is not None:
                    self._header_timer.cancel()
                    self._header_timer = None

            def _too_slow(self) -> None:
                self._header_timer = None
                guard.closed_idle += 1
                self.transport.close()

        return GuardedHttpToolsProtocol


def server_options(header_timeout_s: float, max_connections_per_client: int) -> dict[str, Any]:
    """uvicorn's settings for `infersight serve`: the guarded protocol, idle keep-alive
    connections closed after 5 s (uvicorn's default, stated), and `X-Forwarded-For` not
    trusted (uvicorn trusts it from 127.0.0.1 by default: a client on loopback could name
    itself a new address on every request and escape its per-address rate, rate_limit.py)."""
    guard = ConnectionGuard(header_timeout_s=header_timeout_s, max_per_client=max_connections_per_client)
    return {"http": guard.protocol(), "timeout_keep_alive": 5, "proxy_headers": False}
