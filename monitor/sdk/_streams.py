"""@track on generators and async generators: a stream is one call, its items its output tokens.

The first item sets the time to first token (TTFT). The time per output token (TPOT) is
`(duration - TTFT) / (items - 1)`, the definition serving benchmarks use (vLLM's among
them): the stream's end counts as its last token, so nothing is read per item but the
item itself. The call is recorded once, when the stream ends: exhausted, raised (its
exception's type), closed by the consumer (no error) or cancelled.

Each wrapper is the same kind of function as the user's (a Python generator function, whose
calls are `types.GeneratorType`s; an async generator function for an async one) and
delegates `send`, `throw` and `close` (`asend`, `athrow`, `aclose`) as `yield from` would,
return value included. A call
whose text is not sampled takes the cheapest loop its generator allows, with its state in
locals (no object, no closure per call):
- pass-through: a `for` (`async for`) loop that counts items in a local and yields each
  one, for generators that return nothing and drop what is sent to them
  (`returns_only_none`, `drops_sent_values`, read once from the bytecode), which is what a
  token stream is; a value sent is dropped, as the generator would drop it, and a `throw`
  hands over to the general loop (a loop costs per item what `yield from
  itertools.compress(gen, counter)` costs, and less per call);
- loop: the same loop, for generators that return nothing but may use what is sent
  (`x = yield`, `yield from`), with a check of what was sent: on the first `send` of a
  value or `throw` it hands over to the general loop;
- general (`_drive`): `send`/`throw` on the generator, items kept for the response text
  when sampled; from the start for sampled calls and generators that may return a value.
Async generators cannot return a value and have no `yield from`: the same two loops
(`async for`), then the general loop (`_adrive`: `asend`/`athrow`) once the consumer throws
(or, for one that may use what is sent, sends a value).
"""

from __future__ import annotations

import dis
import functools
import inspect
from collections.abc import AsyncGenerator, Callable, Generator
from random import random as rand
from types import CodeType
from typing import Any, Protocol

from infersight.collectors._recording import Series

__all__ = [
    "StreamHost",
    "drops_sent_values",
    "returns_only_none",
    "wrap_async_generator",
    "wrap_generator",
]


class _Config(Protocol):
    @property
    def sample_rate(self) -> float: ...


class _Configured(Protocol):
    @property
    def config(self) -> _Config: ...


class StreamHost(Protocol):
    """What the stream wrappers use of their Tracker (which imports this module)."""

    series: Series
    clock: Callable[[], float]
    rate: float | None  # None: the monitor's configuration

    @property
    def monitor(self) -> _Configured: ...

    def internal(self, stage: str) -> None: ...

    def extract_prompt(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None: ...

    def extract_response(self, result: Any) -> str | None: ...

    def request_id_of(self, result: Any) -> str | None: ...

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
    ) -> None: ...


def _code(fn: Callable[..., Any]) -> CodeType | None:
    code = getattr(fn, "__code__", None)
    return code if isinstance(code, CodeType) else None


def returns_only_none(fn: Callable[..., Any]) -> bool:
    """Whether every `return` in `fn`'s own code returns None (False when unsure)."""
    code = _code(fn)
    if code is None:
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


def drops_sent_values(fn: Callable[..., Any]) -> bool:
    """Whether every `yield` in `fn`'s own code discards what is sent to it (no `x = yield`,
    no `yield from`): then `send(v)` does what `next()` does (False when unsure). In an async
    generator a suspension that follows a `SEND` is an `await` (or `async for`, `async with`):
    what it receives comes from the event loop, never from `asend`, so it does not count."""
    code = _code(fn)
    if code is None:
        return False
    awaits = bool(code.co_flags & inspect.CO_ASYNC_GENERATOR)
    instructions = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "NOP", "RESUME")]
    for i, ins in enumerate(instructions):
        if ins.opname != "YIELD_VALUE" or (awaits and i and instructions[i - 1].opname == "SEND"):
            continue
        if i + 1 >= len(instructions) or instructions[i + 1].opname != "POP_TOP":
            return False
    return True


def _record(
    host: StreamHost,
    start: float,
    first: float,
    n: int,
    error_type: str | None,
    chunks: list[Any] | None = None,
    prompt: str | None = None,
) -> None:
    """The stream ended: one observation; and one sampled record when `chunks` is kept."""
    try:
        end = host.clock()
        ttft = first - start if n else None
        tpot = (end - first) / (n - 1) if n > 1 else None
        host.series.exit(end, end - start, ttft, tpot, None, None, n or None, error_type)
        if chunks is not None:
            if error_type is None:
                response, rid = host.extract_response(chunks), host.request_id_of(chunks)
            else:
                response = rid = None
            host.sample(start, end, ttft, tpot, None, None, n or None, error_type, prompt, response, rid)
    except Exception:
        host.internal("finish")


def _first_item_at(host: StreamHost) -> float:
    try:
        return host.clock()
    except Exception:
        host.internal("token")
        return 0.0


def _drive(
    host: StreamHost,
    gen: Generator[Any, Any, Any],
    start: float,
    n: int,
    first: float,
    sent: Any,
    thrown: BaseException | None,
    chunks: list[Any] | None,
    prompt: str | None,
) -> Generator[Any, Any, Any]:
    """The general loop, from a state: `n` items so far, then `send(sent)` or `throw(thrown)`."""
    send, throw = gen.send, gen.throw
    closing = False
    try:
        while True:
            if thrown is None:
                value = send(sent)
            else:
                error, thrown = thrown, None
                value = throw(error)
            if not n:
                first = _first_item_at(host)
            n += 1
            if chunks is not None:
                chunks.append(value)
            try:
                sent = yield value
            except GeneratorExit:
                closing = True
                raise
            except BaseException as exc:
                thrown = exc
    except StopIteration as stop:
        _record(host, start, first, n, None, chunks, prompt)
        return stop.value
    except BaseException as exc:
        if closing:
            _record(host, start, first, n, None, chunks, prompt)
            gen.close()
        else:
            _record(host, start, first, n, type(exc).__name__, chunks, prompt)
        raise


def wrap_generator(fn: Callable[..., Any], host: StreamHost) -> Callable[..., Any]:
    """`fn` (a generator function) under @track: a generator function of the same signature."""
    plain = returns_only_none(fn)
    passthrough = plain and drops_sent_values(fn)
    clock = host.clock
    series = host.series
    entered = series.entered.incr
    streamed = series.streamed.extend
    mask = series.fold_mask
    monitor = host.monitor

    @functools.wraps(fn)
    def tracked(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        try:
            rate = host.rate
            if rate is None:
                rate = monitor.config.sample_rate
            sampled = rate and (rate >= 1.0 or rand() < rate)
            start = clock()
            k = entered()
        except Exception:
            host.internal("start")
            start = None
        if start is None:  # the SDK failed: the user's generator, untracked
            return (yield from fn(*args, **kwargs))
        try:  # without keywords, the tuple as it came: `**kwargs` would copy the dict
            gen = fn(*args, **kwargs) if kwargs else fn(*args)
        except BaseException as exc:
            _record(host, start, 0.0, 0, type(exc).__name__, None, None)
            raise
        if sampled:
            prompt = host.extract_prompt(args, kwargs)
            return (yield from _drive(host, gen, start, 0, 0.0, None, None, [], prompt))
        if not plain:
            return (yield from _drive(host, gen, start, 0, 0.0, None, None, None, None))
        n = 0
        first = 0.0
        thrown: BaseException | None = None
        sent: Any = None
        closing = False
        try:
            # The loops below, and the async ones in wrap_async_generator, are written out
            # once per case on purpose: they run per item inside the user's stream, where a
            # shared helper (a call or a `yield from` per item) costs more than the whole
            # per-call target (docs/benchmarks/sdk-overhead.md).
            if passthrough:  # what is sent is dropped, as the generator would drop it
                for value in gen:
                    if not n:
                        try:
                            first = clock()
                        except Exception:
                            host.internal("token")
                    n += 1
                    try:
                        yield value
                    except GeneratorExit:
                        closing = True
                        raise
                    except BaseException as exc:
                        thrown = exc
                        break
            else:
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
                        closing = True
                        raise
                    except BaseException as exc:
                        thrown = exc
                        break
                    if sent is not None:
                        break
        except BaseException as exc:
            if closing:
                _record(host, start, first, n, None, None, None)
                gen.close()
            else:
                _record(host, start, first, n, type(exc).__name__, None, None)
            raise
        if not n:
            _record(host, start, first, n, None, None, None)
            return None
        if thrown is not None or sent is not None:
            return (yield from _drive(host, gen, start, n, first, sent, thrown, None, None))
        try:
            streamed((start, first, clock(), n))
            if k & mask == mask:
                series.fold()
        except Exception:
            host.internal("finish")
        return None

    return tracked


async def _adrive(
    host: StreamHost,
    agen: AsyncGenerator[Any, Any],
    start: float,
    n: int,
    first: float,
    sent: Any,
    thrown: BaseException | None,
    chunks: list[Any] | None,
    prompt: str | None,
) -> AsyncGenerator[Any, Any]:
    """`_drive` for an async generator: `asend(sent)` or `athrow(thrown)` from a state."""
    closing = False
    try:
        while True:
            if thrown is None:
                value = await agen.asend(sent)
            else:
                error, thrown = thrown, None
                value = await agen.athrow(error)
            if not n:
                first = _first_item_at(host)
            n += 1
            if chunks is not None:
                chunks.append(value)
            try:
                sent = yield value
            except GeneratorExit:
                closing = True
                raise
            except BaseException as exc:
                thrown = exc
    except StopAsyncIteration:
        _record(host, start, first, n, None, chunks, prompt)
        return
    except BaseException as exc:  # CancelledError included
        if closing:
            _record(host, start, first, n, None, chunks, prompt)
            await agen.aclose()
        else:
            _record(host, start, first, n, type(exc).__name__, chunks, prompt)
        raise


def wrap_async_generator(fn: Callable[..., Any], host: StreamHost) -> Callable[..., Any]:
    """`fn` (an async generator function) under @track: an async generator function."""
    passthrough = drops_sent_values(fn)
    clock = host.clock
    series = host.series
    entered = series.entered.incr
    streamed = series.streamed.extend
    mask = series.fold_mask
    monitor = host.monitor

    @functools.wraps(fn)
    async def tracked(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        try:
            rate = host.rate
            if rate is None:
                rate = monitor.config.sample_rate
            sampled = rate and (rate >= 1.0 or rand() < rate)
            start = clock()
            k = entered()
        except Exception:
            host.internal("start")
            start = None
        if start is None:  # the SDK failed: the user's stream, untracked
            async for value in fn(*args, **kwargs):
                yield value
            return
        try:
            agen = fn(*args, **kwargs) if kwargs else fn(*args)
        except BaseException as exc:
            _record(host, start, 0.0, 0, type(exc).__name__, None, None)
            raise
        chunks: list[Any] | None = None
        prompt = None
        n = 0
        first = 0.0
        sent: Any = None
        thrown: BaseException | None = None
        if sampled:
            chunks, prompt = [], host.extract_prompt(args, kwargs)
        else:
            closing = False
            try:
                ended = False
                if passthrough:  # what is sent is dropped, as the generator drops it
                    async for value in agen:
                        if not n:
                            try:
                                first = clock()
                            except Exception:
                                host.internal("token")
                        n += 1
                        try:
                            yield value
                        except GeneratorExit:
                            closing = True
                            raise
                        except BaseException as exc:
                            thrown = exc
                            break
                    else:
                        ended = True
                else:
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
                            closing = True
                            raise
                        except BaseException as exc:
                            thrown = exc
                            break
                        if sent is not None:
                            break
                    else:
                        ended = True
            except BaseException as exc:  # CancelledError included
                if closing:
                    _record(host, start, first, n, None, None, None)
                    await agen.aclose()
                else:
                    _record(host, start, first, n, type(exc).__name__, None, None)
                raise
            if ended:
                if n:
                    try:
                        streamed((start, first, clock(), n))
                        if k & mask == mask:
                            series.fold()
                    except Exception:
                        host.internal("finish")
                else:
                    _record(host, start, first, n, None, None, None)
                return
        # sampled, or sent a value or thrown into: the general loop, delegated to as
        # `yield from` would (async generators have none)
        general = _adrive(host, agen, start, n, first, sent, thrown, chunks, prompt)
        try:
            value = await general.asend(None)
            while True:
                try:
                    sent = yield value
                except GeneratorExit:
                    await general.aclose()
                    raise
                except BaseException as exc:
                    value = await general.athrow(exc)
                else:
                    value = await general.asend(sent)
        except StopAsyncIteration:
            return

    return tracked
