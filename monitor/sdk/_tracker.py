"""Tracker: what `track(...)` returns. A decorator for sync functions, coroutines,
generators and async generators, and a (sync or async) context manager.

Every call gets fresh state (local variables, or a new `Call`), so one tracker serves
any number of concurrent calls, threads and tasks. The context-manager form keeps
its open calls on a context variable, per thread and per asyncio task.
"""

from __future__ import annotations

import random
import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ._call import Call
from ._wrap import wrap

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._monitor import Monitor

__all__ = ["Tracker"]

_OPEN: ContextVar[tuple[tuple[Tracker, Call], ...]] = ContextVar("infersight_open_calls", default=())


class Tracker:
    def __init__(
        self,
        monitor: Monitor,
        *,
        model: str,
        model_version: str,
        sample_rate: float | None,
        extract_prompt: Callable[[tuple[Any, ...], dict[str, Any]], Any] | None,
        extract_response: Callable[[Any], Any] | None,
    ) -> None:
        self.monitor = monitor
        self.model = model
        self.model_version = model_version
        self.rate = sample_rate  # None: follow the monitor's configuration
        self._extract_prompt = extract_prompt
        self._extract_response = extract_response
        self.series = monitor.stats.series(model, model_version)
        self.clock = monitor.clock
        self._random = random.random

    # -- decorator ---------------------------------------------------------------------
    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return wrap(fn, self)

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
        response = None if error_type is not None else self.extract_response(result)
        self.sample(
            start, end, None, None, None, None, None, error_type, self.extract_prompt(args, kwargs), response
        )

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
                )
            )
        except Exception:
            self.internal("sample")
