"""@track on generators and async generators: a stream is one call, its items its output tokens.

The first item sets the time to first token (TTFT). The time per output token (TPOT) is
`(duration - TTFT) / (items - 1)`, the definition serving benchmarks use (vLLM's among
them): the stream's end counts as its last token, so nothing is read per item but the
item itself. The call is recorded once, when the stream ends: exhausted, raised (its
exception's type), closed by the consumer (no error) or cancelled.

Each wrapper is the same kind of function as the user's and delegates `send`, `throw` and
`close` (`asend`, `athrow`, `aclose`) as `yield from` would, return value included. Two
loops in one frame, with the call's state in locals (no object, no closure per call):
- the fast loop, a plain `for` (`async for`) over the user's generator, counting items in
  a local: taken by calls whose text is not sampled, while the consumer only iterates;
- the general loop, driving the generator with `send`/`throw` (`asend`/`athrow`): taken
  from the start by sampled calls (they keep the items for the response text) and by
  generators that may `return` a value (a `for` loop would drop it), and from the first
  `send` of a value or `throw` on.

A `for` loop cannot hand back a generator's return value; whether a generator function
can return anything but None is read once from its bytecode (`returns_only_none`), and
any doubt takes the general loop.
"""

from __future__ import annotations

import dis
import functools
from collections.abc import AsyncGenerator, Callable, Generator
from types import CodeType
from typing import Any, Protocol

from infersight.collectors._recording import Series

__all__ = ["StreamHost", "returns_only_none", "wrap_async_generator", "wrap_generator"]


class StreamHost(Protocol):
    """What the stream wrappers use of their Tracker (which imports this module)."""

    series: Series
    clock: Callable[[], float]

    def decide_sample(self) -> bool: ...

    def internal(self, stage: str) -> None: ...

    def extract_prompt(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None: ...

    def extract_response(self, result: Any) -> str | None: ...

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
    ) -> None: ...


def returns_only_none(fn: Callable[..., Any]) -> bool:
    """Whether every `return` in `fn`'s own code returns None (False when unsure)."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, CodeType):
        return False
    previous: dis.Instruction | None = None
    for ins in dis.get_instructions(code):
        if ins.opname == "RETURN_CONST" and ins.argval is not None:
            return False
        if ins.opname == "RETURN_VALUE" and (
            ins.is_jump_target
            or previous is None
            or previous.opname != "LOAD_CONST"
            or previous.argval is not None
        ):
            return False
        previous = ins
    return True


def _record(
    host: StreamHost,
    start: float,
    first: float,
    n: int,
    error_type: str | None,
    chunks: list[Any] | None,
    prompt: str | None,
) -> None:
    """The stream ended: one observation; and one sampled record when `chunks` is kept."""
    try:
        end = host.clock()
        ttft = first - start if n else None
        tpot = (end - first) / (n - 1) if n > 1 else None
        host.series.exit(end, end - start, ttft, tpot, None, None, n or None, error_type)
        if chunks is not None:
            response = host.extract_response(chunks) if error_type is None else None
            host.sample(start, end, ttft, tpot, None, None, n or None, error_type, prompt, response)
    except Exception:
        host.internal("finish")


def _begin(
    host: StreamHost, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[float, list[Any] | None, str | None]:
    """(start, the items list if sampled, the prompt if sampled); raises only the SDK's own
    errors (the extractors never raise)."""
    chunks: list[Any] | None = None
    prompt = None
    if host.decide_sample():
        chunks = []
        prompt = host.extract_prompt(args, kwargs)
    start = host.clock()
    host.series.entered.incr()
    return start, chunks, prompt


def wrap_generator(fn: Callable[..., Any], host: StreamHost) -> Callable[..., Any]:
    plain_ok = returns_only_none(fn)
    clock = host.clock

    @functools.wraps(fn)
    def tracked(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        try:
            start, chunks, prompt = _begin(host, args, kwargs)
        except Exception:
            host.internal("start")
            start = None
        if start is None:  # the SDK failed: the user's generator, untracked
            return (yield from fn(*args, **kwargs))
        try:
            gen = fn(*args, **kwargs)
        except BaseException as exc:
            _record(host, start, 0.0, 0, type(exc).__name__, None, None)
            raise
        n = 0
        first = 0.0
        sent: Any = None
        thrown: BaseException | None = None
        done = False
        try:
            if plain_ok and chunks is None:
                for value in gen:
                    if not n:
                        try:
                            first = clock()
                        except Exception:
                            host.internal("token")
                    n += 1
                    try:
                        sent = yield value
                    except GeneratorExit:
                        done = True
                        _record(host, start, first, n, None, None, None)
                        gen.close()
                        raise
                    except BaseException as exc:
                        thrown = exc
                        break
                    if sent is not None:
                        break
                else:
                    done = True
                    _record(host, start, first, n, None, None, None)
                    return None
            send, throw = gen.send, gen.throw
            while True:
                if thrown is None:
                    value = send(sent)
                else:
                    error, thrown = thrown, None
                    value = throw(error)
                if not n:
                    try:
                        first = clock()
                    except Exception:
                        host.internal("token")
                n += 1
                if chunks is not None:
                    chunks.append(value)
                try:
                    sent = yield value
                except GeneratorExit:
                    done = True
                    _record(host, start, first, n, None, chunks, prompt)
                    gen.close()
                    raise
                except BaseException as exc:
                    thrown = exc
        except StopIteration as stop:
            done = True
            _record(host, start, first, n, None, chunks, prompt)
            return stop.value
        except BaseException as exc:
            if not done:
                _record(host, start, first, n, type(exc).__name__, chunks, prompt)
            raise

    return tracked


def wrap_async_generator(fn: Callable[..., Any], host: StreamHost) -> Callable[..., Any]:
    clock = host.clock

    @functools.wraps(fn)
    async def tracked(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        try:
            start, chunks, prompt = _begin(host, args, kwargs)
        except Exception:
            host.internal("start")
            start = None
        if start is None:  # the SDK failed: the user's stream, untracked
            async for value in fn(*args, **kwargs):
                yield value
            return
        try:
            agen = fn(*args, **kwargs)
        except BaseException as exc:
            _record(host, start, 0.0, 0, type(exc).__name__, None, None)
            raise
        n = 0
        first = 0.0
        sent: Any = None
        thrown: BaseException | None = None
        done = False
        try:
            if chunks is None:
                async for value in agen:
                    if not n:
                        try:
                            first = clock()
                        except Exception:
                            host.internal("token")
                    n += 1
                    try:
                        sent = yield value
                    except GeneratorExit:
                        done = True
                        _record(host, start, first, n, None, None, None)
                        await agen.aclose()
                        raise
                    except BaseException as exc:
                        thrown = exc
                        break
                    if sent is not None:
                        break
                else:
                    done = True
                    _record(host, start, first, n, None, None, None)
                    return
            while True:
                if thrown is None:
                    value = await agen.asend(sent)
                else:
                    error, thrown = thrown, None
                    value = await agen.athrow(error)
                if not n:
                    try:
                        first = clock()
                    except Exception:
                        host.internal("token")
                n += 1
                if chunks is not None:
                    chunks.append(value)
                try:
                    sent = yield value
                except GeneratorExit:
                    done = True
                    _record(host, start, first, n, None, chunks, prompt)
                    await agen.aclose()
                    raise
                except BaseException as exc:
                    thrown = exc
        except StopAsyncIteration:
            if not done:
                done = True
                _record(host, start, first, n, None, chunks, prompt)
            return
        except BaseException as exc:  # CancelledError included
            if not done:
                _record(host, start, first, n, type(exc).__name__, chunks, prompt)
            raise

    return tracked
