"""What a caller of `Runtime.submit` holds: a `RequestHandle` streaming token ids, and the
`Completion` it ends with.

The runtime's loop thread produces; any number of threads and event loops consume. Sync
consumers wait on a condition; async consumers park a future that the loop thread
resolves with `loop.call_soon_threadsafe`, so no asyncio object is touched off its loop.
Each iteration starts from the first token, so several consumers may read one request.

Next-token selection: greedy at temperature 0, else temperature + nucleus (top-p) sampling;
and one token per running request of a serving step (`sample_requests`).

A step's greedy rows take one `argmax` over the whole batch. Sampled rows are grouped by
(temperature, top_p, generator): requests without a seed share the runtime's generator and
sample together; a seeded request has its own generator, so its tokens do not depend on which
other requests share its batch. Nothing here reads the device: the caller reads all of a
step's tokens at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from .errors import GenerationFailed, InvalidSamplingParams
from .events import FinishReason

__all__ = ["Completion", "RequestHandle", "Sampled", "check_sampling", "sample", "sample_requests"]


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished request. Times are seconds; `ttft_s` is None when no token was produced."""

    request_id: str
    model_version: str
    prompt_tokens: int
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    queue_s: float
    ttft_s: float | None
    duration_s: float

    @property
    def output_tokens(self) -> int:
        return len(self.token_ids)


class RequestHandle:
    """A submitted request: iterate it for token ids as they come, or wait for `result()`."""

    def __init__(self, request_id: str, model_version: str, cancel: Callable[[RequestHandle], None]) -> None:
        self.request_id = request_id
        self._model_version = model_version
        self._cancel = cancel
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._tokens: list[int] = []
        self._completion: Completion | None = None
        self._error: GenerationFailed | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.path: str | None = None  # SLA routing: "fast" or "standard" (None without routing)
        self.route_reason: str | None = None  # why the router chose it ("short", "spill", ...)

    @property
    def model_version(self) -> str:
        """The version serving this request (the serving version at submit until it starts)."""
        return self._model_version

    def done(self) -> bool:
        with self._lock:
            return self._completion is not None or self._error is not None

    def tokens(self) -> list[int]:
        """The token ids produced so far."""
        with self._lock:
            return list(self._tokens)

    def cancel(self) -> None:
        """Ask the runtime to stop this request; it finishes with finish_reason "cancelled"
        (a no-op once it has finished)."""
        if not self.done():
            self._cancel(self)

    def result(self, timeout: float | None = None) -> Completion:
        """Block until the request finishes. Raises `GenerationFailed` if the model failed
        on it, `TimeoutError` after `timeout` seconds."""
        with self._lock:
            if not self._changed.wait_for(
                lambda: self._completion is not None or self._error is not None, timeout
            ):
                raise TimeoutError(f"request {self.request_id} not finished after {timeout} s")
            return self._outcome()

    async def aresult(self) -> Completion:
        async for _ in self:
            pass
        with self._lock:
            return self._outcome()

    def __iter__(self) -> Iterator[int]:
        index = 0
        while True:
            with self._lock:
                while index >= len(self._tokens) and not self._finished():
                    self._changed.wait()
                if index >= len(self._tokens):
                    if self._error is not None:
                        raise self._error
                    return
                token = self._tokens[index]
            index += 1
            yield token

    def __aiter__(self) -> AsyncIterator[int]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[int]:
        loop = asyncio.get_running_loop()
        index = 0
        while True:
            waiter: asyncio.Future[None] | None = None
            token: int | None = None
            with self._lock:
                if index < len(self._tokens):
                    token = self._tokens[index]
                elif self._error is not None:
                    raise self._error
                elif self._completion is not None:
                    return
                else:
                    waiter = loop.create_future()
                    self._waiters.append((loop, waiter))
            if waiter is not None:
                await waiter
                continue
            index += 1
            assert token is not None
            yield token

    def __repr__(self) -> str:
        return f"RequestHandle({self.request_id!r}, version={self._model_version!r}, done={self.done()})"

    # -- producer side: called by the runtime's loop thread only --------------------------

    def _started(self, model_version: str) -> None:
        self._model_version = model_version

    def _push(self, token: int) -> None:
        with self._lock:
            self._tokens.append(token)
            self._wake()

    def _finish(self, completion: Completion) -> None:
        with self._lock:
            self._completion = completion
            self._wake()

    def _fail(self, error: GenerationFailed) -> None:
        with self._lock:
            self._error = error
            self._wake()

    def _finished(self) -> bool:
        return self._completion is not None or self._error is not None

    def _outcome(self) -> Completion:
        if self._error is not None:
            raise self._error
        assert self._completion is not None
        return self._completion

    def _wake(self) -> None:
        # with self._lock held
        self._changed.notify_all()
        waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that event loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Sampled(Protocol):
    """What `sample_requests` reads of a running request (replica.Request)."""

    temperature: float
    top_p: float
    generator: torch.Generator | None


def check_sampling(temperature: float, top_p: float) -> None:
    """Raise `InvalidSamplingParams` unless temperature >= 0 and 0 < top_p <= 1."""
    if not (temperature >= 0.0):  # also refuses NaN
        raise InvalidSamplingParams(f"temperature must be >= 0, got {temperature!r}")
    if not (0.0 < top_p <= 1.0):
        raise InvalidSamplingParams(f"top_p must be in (0, 1], got {top_p!r}")


def sample(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """logits [B, V] -> token ids [B] (int64). Stays on the logits' device: no host sync.

    `generator` (on the logits' device) makes sampling reproducible; greedy ignores it.
    """
    check_sampling(temperature, top_p)
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # [B, V]
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the tokens more likely than it already reach top_p (keeps >= 1)
        drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def sample_requests(
    logits: torch.Tensor, requests: Sequence[Sampled], shared: torch.Generator
) -> torch.Tensor:
    """logits[B, V] for `requests` (row i is requests[i]) -> LongTensor[B] on the same device."""
    greedy = logits.argmax(dim=-1)  # [B]
    groups: dict[tuple[float, float, int], list[int]] = {}
    generators: dict[int, torch.Generator] = {}
    for row, request in enumerate(requests):
        if request.temperature <= 0.0:
            continue
        generator = request.generator if request.generator is not None else shared
        generators[id(generator)] = generator
        groups.setdefault((request.temperature, request.top_p, id(generator)), []).append(row)
    if not groups:
        return greedy
    out = greedy.clone()
    for (temperature, top_p, gen_id), rows in groups.items():
        index = torch.tensor(rows, device=logits.device)
        picked = sample(
            logits.index_select(0, index), temperature=temperature, top_p=top_p, generator=generators[gen_id]
        )
        out.index_copy_(0, index, picked.reshape(-1).to(out.dtype))
    return out
