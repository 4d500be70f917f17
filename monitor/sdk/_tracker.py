"""Tracking one call: what `track(...)` returns, the state of each call, and the wrappers.

`Tracker` is a decorator for sync functions, coroutines, generators and async generators,
and a (sync or async) context manager. Every call gets fresh state (local variables, or a
new `Call`), so one tracker serves any number of concurrent calls, threads and tasks; the
context-manager form keeps its open calls on a context variable (per thread and task).

Each wrapper is the same kind of function as the user's, with its name, docstring and
signature (`functools.wraps`). Plain calls and coroutines keep their state in locals: the
hot path is two clock reads, one counter step and one `extend` of the label set's buffer,
without a lock (`infersight.collectors._recording`), and the fold of that buffer once in
about 4096 calls. Generators and async generators are wrapped in `_streams`: their items
count as output tokens, and the call is recorded once, when the stream ends.

A sampled record's request id is generated in the delivery thread, unless the tracker has
`request_id=`: a function of what `extract_response` gets (the result, or the list of a
stream's items) returning the id the user already holds, so that feedback can name it. It
runs only for sampled calls that did not raise; a failing or bad one is counted and the
generated id used.

User exceptions are re-raised unchanged with a bare `raise`. The SDK's own failures are
counted and swallowed, never raised inside an `except` that holds the user's exception.
"""

from __future__ import annotations

import functools
import inspect
import math
import random
import time
from collections.abc import Callable
from contextvars import ContextVar
from random import random as rand
from typing import Any, Protocol

from infersight.collectors import InferenceStats

from ._config import SDKConfig, SDKCounters
from ._streams import wrap_async_generator, wrap_generator

__all__ = ["MAX_REQUEST_ID_CHARS", "Call", "Host", "Tracker"]

# The longest id feedback accepts (the SDK's and the service's check), so that a record the
# user names by its own id can always be joined.
MAX_REQUEST_ID_CHARS = 256


class Host(Protocol):
    """What a Tracker uses of its Monitor (a protocol: this module does not import the Monitor)."""

    stats: InferenceStats
    config: SDKConfig
    counters: SDKCounters

    def clock(self) -> float: ...

    def enqueue(self, item: tuple[Any, ...]) -> None: ...


_OPEN: ContextVar[tuple[tuple[Tracker, Call], ...]] = ContextVar("infersight_open_calls", default=())


class Tracker:
    def __init__(
        self,
        monitor: Host,
        *,
        model: str,
        model_version: str,
        sample_rate: float | None,
        extract_prompt: Callable[[tuple[Any, ...], dict[str, Any]], Any] | None,
        extract_response: Callable[[Any], Any] | None,
        request_id: Callable[[Any], Any] | None = None,
    ) -> None:
        self.monitor = monitor
        self.model = model
        self.model_version = model_version
        self.rate = sample_rate  # None: follow the monitor's configuration
        self._extract_prompt = extract_prompt
        self._extract_response = extract_response
        self._request_id = request_id
        self.series = monitor.stats.series(model, model_version)
        self.clock = monitor.clock
        self._random = random.random

    # -- decorator ---------------------------------------------------------------------
    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(fn):
            return wrap_async_generator(fn, self)
        if inspect.isgeneratorfunction(fn):
            return wrap_generator(fn, self)
        if inspect.iscoroutinefunction(fn):
            return _wrap_coroutine(fn, self)
        return _wrap_plain(fn, self)

    # -- context manager -----------------------------------------------------------------
    def __enter__(self) -> Call:
        call = Call(self)
        try:
            _OPEN.set((*_OPEN.get(), (self, call)))
        except Exception:
            self.internal("start")
        return call

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        call = self._pop()
        if call is not None:
            call.finish(None if exc_type is None or exc_type is GeneratorExit else exc_type.__name__)

    async def __aenter__(self) -> Call:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def _pop(self) -> Call | None:
        try:
            stack = _OPEN.get()
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] is self:
                    _OPEN.set(stack[:i] + stack[i + 1 :])
                    return stack[i][1]
        except Exception:
            self.internal("finish")
        return None

    # -- helpers the wrappers and Call use (none of them raises) -------------------------------
    def decide_sample(self) -> bool:
        rate = self.rate if self.rate is not None else self.monitor.config.sample_rate
        return bool(rate) and (rate >= 1.0 or self._random() < rate)

    def internal(self, stage: str) -> None:
        try:
            self.monitor.counters.count("internal", stage)
        except Exception:
            return

    def reject(self, reason: str) -> None:
        try:
            self.monitor.counters.count("rejected", reason)
        except Exception:
            return

    def check_text(self, text: Any) -> str | None:
        if text is None or isinstance(text, str):
            return text
        self.reject("non_string_payload")
        return None

    def extract_prompt(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        try:
            text = (self._extract_prompt or self.monitor.config.extract_prompt)(args, kwargs)
        except Exception:
            self.internal("extract_prompt")
            return None
        return text if text is None or isinstance(text, str) else self.check_text(text)

    def extract_response(self, result: Any) -> str | None:
        try:
            text = (self._extract_response or self.monitor.config.extract_response)(result)
        except Exception:
            self.internal("extract_response")
            return None
        return text if text is None or isinstance(text, str) else self.check_text(text)

    def request_id_of(self, result: Any) -> str | None:
        """The user's id for a sampled call's result; None: the delivery thread generates one."""
        if self._request_id is None:
            return None
        try:
            rid = self._request_id(result)
        except Exception:
            self.internal("request_id")
            return None
        if isinstance(rid, str) and 0 < len(rid) <= MAX_REQUEST_ID_CHARS:
            return rid
        self.internal("request_id")
        return None

    def failed(self, start: float, exc: BaseException, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A plain call raised: record it with its error type (the caller re-raises)."""
        try:
            end = self.clock()
            error_type = type(exc).__name__
            self.series.exit(end, end - start, None, None, None, None, None, error_type)
            if self.decide_sample():
                self.sample_call(start, end, args, kwargs, None, error_type)
        except Exception:
            self.internal("finish")

    def sample_call(
        self,
        start: float,
        end: float,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        result: Any,
        error_type: str | None,
    ) -> None:
        """A finished plain call or coroutine, sampled (positional: no keyword handling on the
        caller's path; the extractors never raise)."""
        response = rid = None
        if error_type is None:
            response = self.extract_response(result)
            if self._request_id is not None:  # the common case skips a call
                rid = self.request_id_of(result)
        prompt = self.extract_prompt(args, kwargs)
        self.sample(start, end, None, None, None, None, None, error_type, prompt, response, rid)

    def sample(
        self,
        start: float,
        end: float,
        ttft: float | None = None,
        tpot: float | None = None,
        queue: float | None = None,
        prompt_tokens: int | None = None,
        output_tokens: int | None = None,
        error_type: str | None = None,
        prompt: str | None = None,
        response: str | None = None,
        request_id: str | None = None,
    ) -> None:
        try:
            duration = end - start
            self.monitor.enqueue(
                (
                    self.model,
                    self.model_version,
                    time.time() - duration,
                    duration,
                    ttft,
                    tpot,
                    queue,
                    prompt_tokens,
                    output_tokens,
                    error_type,
                    prompt,
                    response,
                    request_id,
                )
            )
        except Exception:
            self.internal("sample")


class Call:
    """One call in progress. In a `with track(...) as call:` block:
    `call.token()` at each streamed token (the first sets the time to first token),
    `call.set_prompt(text)`, `call.set_response(text)`,
    `call.set_token_counts(prompt_tokens=..., output_tokens=...)`, `call.set_queue_time(s)`,
    `call.set_request_id(id)` (the record's request id when sampled, for feedback to name)."""

    __slots__ = (
        "_done",
        "_first",
        "_last",
        "_output_tokens",
        "_prompt",
        "_prompt_tokens",
        "_queue_s",
        "_request_id",
        "_response",
        "_start",
        "_tokens",
        "_tracker",
        "sampled",
    )

    def __init__(self, tracker: Tracker, *, prompt: Any = None) -> None:
        self._tracker = tracker
        self._done = True  # until the start is recorded
        self._first: float | None = None
        self._last: float | None = None
        self._tokens = 0
        self._prompt = prompt
        self._response: Any = None
        self._prompt_tokens: int | None = None
        self._output_tokens: int | None = None
        self._queue_s: float | None = None
        self._request_id: str | None = None
        self.sampled = False
        try:
            self.sampled = tracker.decide_sample()
            self._start = tracker.clock()
            tracker.series.enter()
            self._done = False
        except Exception:
            tracker.internal("start")

    # -- the user's API (context manager) -----------------------------------------------
    def token(self, n: int = 1) -> None:
        """Mark `n` output tokens as produced now (the first call sets TTFT)."""
        try:
            now = self._tracker.clock()
            if self._first is None:
                self._first = now
            self._last = now
            self._tokens += n if isinstance(n, int) and n > 0 else 1
        except Exception:
            self._tracker.internal("token")

    def set_prompt(self, text: Any) -> None:
        self._prompt = self._tracker.check_text(text)

    def set_response(self, text: Any) -> None:
        self._response = self._tracker.check_text(text)

    def set_request_id(self, request_id: Any) -> None:
        if isinstance(request_id, str) and 0 < len(request_id) <= MAX_REQUEST_ID_CHARS:
            self._request_id = request_id
        else:
            self._tracker.internal("request_id")

    def set_token_counts(self, *, prompt_tokens: Any = None, output_tokens: Any = None) -> None:
        for name, value in (("_prompt_tokens", prompt_tokens), ("_output_tokens", output_tokens)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                self._tracker.reject("invalid_count")
            else:
                setattr(self, name, value)

    def set_queue_time(self, seconds: Any) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            self._tracker.reject("invalid_number")
        elif math.isnan(seconds):
            self._tracker.reject("nan_duration")
        elif seconds < 0:
            self._tracker.reject("negative_duration")
        elif math.isinf(seconds):
            self._tracker.reject("infinite_duration")
        else:
            self._queue_s = float(seconds)

    def finish(self, error_type: str | None = None) -> None:
        """Record the call once (later calls do nothing)."""
        if self._done:
            return
        self._done = True
        try:
            t = self._tracker
            end = t.clock()
            start, first, last, n = self._start, self._first, self._last, self._tokens
            ttft = None if first is None else first - start
            tpot = (last - first) / (n - 1) if (n > 1 and first is not None and last is not None) else None
            output_tokens = self._output_tokens if self._output_tokens is not None else (n or None)
            t.series.exit(
                end, end - start, ttft, tpot, self._queue_s, self._prompt_tokens, output_tokens, error_type
            )
            if self.sampled:
                t.sample(
                    start=start,
                    end=end,
                    ttft=ttft,
                    tpot=tpot,
                    queue=self._queue_s,
                    prompt_tokens=self._prompt_tokens,
                    output_tokens=output_tokens,
                    error_type=error_type,
                    prompt=self._prompt,
                    response=self._response,
                    request_id=self._request_id,
                )
        except Exception:
            self._tracker.internal("finish")


# ---- the wrappers, one per kind of function ----------------------------------------------


def _wrap_plain(fn: Callable[..., Any], tracker: Tracker) -> Callable[..., Any]:
    clock = tracker.clock
    series = tracker.series
    entered = series.entered.incr
    timed = series.timed.extend
    mask = series.fold_mask
    monitor = tracker.monitor

    @functools.wraps(fn)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        try:
            start = clock()
            n = entered()
        except Exception:
            start = None
            tracker.internal("start")
        if start is None:
            return fn(*args, **kwargs)
        try:  # without keywords, the tuple as it came: `**kwargs` would copy the dict
            result = fn(*args, **kwargs) if kwargs else fn(*args)
        except BaseException as exc:
            tracker.failed(start, exc, args, kwargs)
            raise
        try:
            end = clock()
            timed((start, end))
            if n & mask == mask:
                series.fold()
            rate = tracker.rate
            if rate is None:
                rate = monitor.config.sample_rate
            if rate and (rate >= 1.0 or rand() < rate):
                tracker.sample_call(start, end, args, kwargs, result, None)
        except Exception:
            tracker.internal("finish")
        return result

    return tracked


def _wrap_coroutine(fn: Callable[..., Any], tracker: Tracker) -> Callable[..., Any]:
    clock = tracker.clock
    series = tracker.series
    entered = series.entered.incr
    timed = series.timed.extend
    mask = series.fold_mask
    monitor = tracker.monitor

    @functools.wraps(fn)
    async def tracked(*args: Any, **kwargs: Any) -> Any:
        try:
            start = clock()
            n = entered()
        except Exception:
            start = None
            tracker.internal("start")
        if start is None:
            return await fn(*args, **kwargs)
        try:
            result = await (fn(*args, **kwargs) if kwargs else fn(*args))
        except BaseException as exc:  # CancelledError included: recorded as its type
            tracker.failed(start, exc, args, kwargs)
            raise
        try:
            end = clock()
            timed((start, end))
            if n & mask == mask:
                series.fold()
            rate = tracker.rate
            if rate is None:
                rate = monitor.config.sample_rate
            if rate and (rate >= 1.0 or rand() < rate):
                tracker.sample_call(start, end, args, kwargs, result, None)
        except Exception:
            tracker.internal("finish")
        return result

    return tracked
