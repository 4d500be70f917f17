"""The decorator's wrappers, one per kind of function. `functools.wraps` keeps the
name, docstring and `__wrapped__` (so `inspect.signature` is the user's), and each
wrapper is itself the same kind of function (coroutine, generator, async generator).

Plain calls and coroutines keep their state in local variables: the hot path is two
clock reads, two counter increments and one locked append. User exceptions are
recorded and re-raised with a bare `raise`, unchanged; the SDK's own failures are
counted and swallowed, and never raised inside an `except` block that holds the
user's exception (which would chain onto it).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from random import random as rand
from typing import TYPE_CHECKING, Any

from ._stream import wrap_async_generator, wrap_generator

if TYPE_CHECKING:
    from ._tracker import Tracker

__all__ = ["wrap"]


def wrap(fn: Callable[..., Any], tracker: Tracker) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(fn):
        return wrap_async_generator(fn, tracker)
    if inspect.isgeneratorfunction(fn):
        return wrap_generator(fn, tracker)
    if inspect.iscoroutinefunction(fn):
        return _wrap_coroutine(fn, tracker)
    return _wrap_plain(fn, tracker)


def _wrap_plain(fn: Callable[..., Any], tracker: Tracker) -> Callable[..., Any]:
    clock = tracker.clock
    enter = tracker.series.enter
    exit_ = tracker.series.exit
    monitor = tracker.monitor

    @functools.wraps(fn)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        try:
            start = clock()
            enter()
        except Exception:
            start = None
            tracker.internal("start")
        if start is None:
            return fn(*args, **kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            tracker.failed(start, exc, args, kwargs)
            raise
        try:
            end = clock()
            exit_(end, end - start)
            rate = tracker.rate if tracker.rate is not None else monitor.config.sample_rate
            if rate and (rate >= 1.0 or rand() < rate):
                tracker.sample_call(start, end, args, kwargs, result, None)
        except Exception:
            tracker.internal("finish")
        return result

    return tracked


def _wrap_coroutine(fn: Callable[..., Any], tracker: Tracker) -> Callable[..., Any]:
    clock = tracker.clock
    enter = tracker.series.enter
    exit_ = tracker.series.exit
    monitor = tracker.monitor

    @functools.wraps(fn)
    async def tracked(*args: Any, **kwargs: Any) -> Any:
        try:
            start = clock()
            enter()
        except Exception:
            start = None
            tracker.internal("start")
        if start is None:
            return await fn(*args, **kwargs)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:  # CancelledError included: recorded as its type
            tracker.failed(start, exc, args, kwargs)
            raise
        try:
            end = clock()
            exit_(end, end - start)
            rate = tracker.rate if tracker.rate is not None else monitor.config.sample_rate
            if rate and (rate >= 1.0 or rand() < rate):
                tracker.sample_call(start, end, args, kwargs, result, None)
        except Exception:
            tracker.internal("finish")
        return result

    return tracked
