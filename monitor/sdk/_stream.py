"""Wrappers for generators and async generators (streamed tokens).

Each yielded item counts as one output token: the first sets the time to first
token, the spacing of the rest gives the time per output token. The wrapper
delegates `send()`, `throw()` and `close()` (and their async forms) to the user's
generator, as `yield from` would, and records the call once: on exhaustion, on an
exception (its type), on `close()`/`aclose()` (no error), or on cancellation
(`CancelledError`). A sampled call keeps the yielded items for its response text.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Callable, Generator
from typing import TYPE_CHECKING, Any

from ._call import Call

if TYPE_CHECKING:
    from ._tracker import Tracker

__all__ = ["wrap_async_generator", "wrap_generator"]


def _start(tracker: Tracker, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    call = Call(tracker, keep_chunks=True)
    if call.sampled:
        call.set_prompt(tracker.extract_prompt(args, kwargs))
    return call


def wrap_generator(fn: Callable[..., Any], tracker: Tracker) -> Callable[..., Any]:
    @functools.wraps(fn)
    def tracked(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        call = _start(tracker, args, kwargs)
        try:
            gen = fn(*args, **kwargs)
        except BaseException as exc:
            call.finish(type(exc).__name__)
            raise
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            try:
                if thrown is None:
                    value = gen.send(sent)
                else:
                    error, thrown = thrown, None
                    value = gen.throw(error)
            except StopIteration as stop:
                call.finish(None)
                return stop.value
            except BaseException as exc:
                call.finish(type(exc).__name__)
                raise
            call.item(value)
            try:
                sent = yield value
            except GeneratorExit:
                call.finish(None)
                gen.close()
                raise
            except BaseException as exc:
                thrown = exc

    return tracked


def wrap_async_generator(fn: Callable[..., Any], tracker: Tracker) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def tracked(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        call = _start(tracker, args, kwargs)
        try:
            agen = fn(*args, **kwargs)
        except BaseException as exc:
            call.finish(type(exc).__name__)
            raise
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            try:
                if thrown is None:
                    value = await agen.asend(sent)
                else:
                    error, thrown = thrown, None
                    value = await agen.athrow(error)
            except StopAsyncIteration:
                call.finish(None)
                return
            except BaseException as exc:  # CancelledError included
                call.finish(type(exc).__name__)
                raise
            call.item(value)
            try:
                sent = yield value
            except GeneratorExit:
                call.finish(None)
                await agen.aclose()
                raise
            except BaseException as exc:
                thrown = exc

    return tracked
