"""@track's generator and async-generator wrappers (monitor/sdk/_streams.py) under the whole
generator protocol: next, send, throw, close, return values, dropping, binding, pickling, and
what is kept after a stream ends. Payload sampling is off unless a test says otherwise: that is
the unsampled loops' path, the one a token stream takes; the figures come from a controlled
clock. tests/test_sdk_streams.py has the sampled records and cancellation."""

from __future__ import annotations

import asyncio
import gc
import inspect
import pickle
import types
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from infersight.monitor.records import InferenceRecord
from infersight.monitor.sdk import Monitor


class Clock:
    def __init__(self) -> None:
        self.t = 100.0
        self.broken = False

    def __call__(self) -> float:
        if self.broken:
            raise RuntimeError("clock broke")
        return self.t


def _stats(monitor: Monitor) -> tuple[int, int, dict[str, int]]:
    return monitor.stats.count(600), monitor.stats.in_flight(), monitor.stats.error_counts()


def test_a_stream_is_still_a_generator_function_with_its_name_signature_and_kind() -> None:
    monitor = Monitor()

    def stream(prompt: str, n: int = 3, *, stop: str = ".") -> Iterator[str]:
        """Tokens."""
        yield from (prompt for _ in range(n))

    async def astream(prompt: str) -> AsyncIterator[str]:
        yield prompt

    for fn, check in ((stream, inspect.isgeneratorfunction), (astream, inspect.isasyncgenfunction)):
        tracked: Any = monitor.track(model="m")(fn)
        assert check(tracked) and tracked.__wrapped__ is fn
        assert (tracked.__name__, tracked.__qualname__, tracked.__doc__) == (
            fn.__name__,
            fn.__qualname__,
            fn.__doc__,
        )
        assert inspect.signature(tracked) == inspect.signature(fn)
    gen = monitor.track(model="m")(stream)("x")
    assert type(gen) is types.GeneratorType and inspect.isgenerator(gen) and iter(gen) is gen
    agen = monitor.track(model="m")(astream)("x")
    assert type(agen) is types.AsyncGeneratorType and inspect.isasyncgen(agen)
    agen.aclose().close()  # never started: nothing to run


def test_exhausted_stream_records_ttft_tpot_and_items_on_the_controlled_clock() -> None:
    clock = Clock()
    monitor = Monitor(clock=clock)

    @monitor.track(model="m", model_version="v")
    def stream(n: int) -> Iterator[int]:
        clock.t += 0.5
        for i in range(n):
            if i:
                clock.t += 0.1
            yield i

    assert list(stream(5)) == [0, 1, 2, 3, 4]
    assert list(stream(1)) == [0]
    assert list(stream(0)) == []
    assert _stats(monitor) == (3, 0, {})
    assert monitor.stats.quantile("ttft", 0.5, 600) == pytest.approx(0.5, rel=0.02)
    assert monitor.stats.quantile("tpot", 0.5, 600) == pytest.approx(0.1, rel=0.02)
    assert monitor.stats.quantile("request_duration", 1.0, 600) == pytest.approx(0.9, rel=0.02)


def test_a_stream_that_is_created_but_never_started_never_enters() -> None:
    monitor = Monitor()

    @monitor.track(model="m")
    def stream() -> Iterator[int]:
        yield 1

    gen = stream()
    assert _stats(monitor) == (0, 0, {})
    del gen
    gc.collect()
    assert _stats(monitor) == (0, 0, {})


def test_start_is_read_at_the_first_step_not_at_the_call() -> None:
    clock = Clock()
    monitor = Monitor(clock=clock)

    @monitor.track(model="m")
    def stream() -> Iterator[int]:
        yield 1

    gen = stream()
    clock.t += 30.0  # created long before it is read (a response that waits for its client)
    assert list(gen) == [1]
    assert monitor.stats.quantile("request_duration", 1.0, 600) == pytest.approx(0.0, abs=1e-3)


def test_return_value_comes_back_through_yield_from() -> None:
    monitor = Monitor()

    @monitor.track(model="m")
    def counted() -> Iterator[int]:
        yield 1
        yield 2
        return 42

    def outer() -> Iterator[int]:
        got = yield from counted()
        yield got

    assert list(outer()) == [1, 2, 42]
    assert _stats(monitor) == (1, 0, {})


def test_sent_values_reach_a_generator_that_uses_them_and_are_dropped_by_one_that_does_not() -> None:
    monitor = Monitor()

    @monitor.track(model="m")
    def accumulate() -> Iterator[int]:
        total = 0
        while total < 10:
            got = yield total
            total += got or 1

    @monitor.track(model="m")
    def tokens() -> Iterator[int]:
        for i in range(3):  # noqa: UP028 (a token stream's shape: drops what is sent)
            yield i

    gen = accumulate()
    assert next(gen) == 0
    assert gen.send(4) == 4  # handed over to the general loop here
    assert gen.send(None) == 5
    assert gen.send(3) == 8
    with pytest.raises(StopIteration):
        gen.send(5)
    gen2 = tokens()
    assert [next(gen2), gen2.send("dropped"), gen2.send(None)] == [0, 1, 2]
    with pytest.raises(StopIteration):
        next(gen2)
    with pytest.raises(TypeError, match="just-started"):
        tokens().send(1)
    assert _stats(monitor) == (2, 0, {})


def test_throw_is_handled_by_the_generator_or_recorded_as_its_error() -> None:
    monitor = Monitor()
    cleaned = []

    @monitor.track(model="m")
    def resilient() -> Iterator[str]:
        try:
            yield "a"
        except KeyError:
            yield "recovered"
        yield "b"

    @monitor.track(model="m")
    def fragile() -> Iterator[str]:
        try:
            yield "a"
        finally:
            cleaned.append(True)

    gen = resilient()
    assert next(gen) == "a"
    assert gen.throw(KeyError("k")) == "recovered"
    assert list(gen) == ["b"]
    gen2 = fragile()
    assert next(gen2) == "a"
    with pytest.raises(ValueError, match="bad"):
        gen2.throw(ValueError("bad"))
    assert cleaned == [True]
    with pytest.raises(OSError):
        fragile().throw(OSError("never started"))  # raised at once, nothing entered
    assert _stats(monitor) == (2, 0, {"ValueError": 1})


def test_close_and_drop_mid_stream_finish_without_error_and_run_cleanup() -> None:
    monitor = Monitor()
    cleaned: list[str] = []

    @monitor.track(model="m")
    def stream(tag: str) -> Iterator[int]:
        try:
            yield from range(100)
        finally:
            cleaned.append(tag)

    gen = stream("closed")
    assert [next(gen), next(gen)] == [0, 1]
    assert monitor.stats.in_flight() == 1
    gen.close()
    gen.close()  # twice: nothing more
    dropped = stream("dropped")
    next(dropped)
    del dropped
    gc.collect()
    assert sorted(cleaned) == ["closed", "dropped"]
    assert _stats(monitor) == (2, 0, {})


def test_errors_mid_stream_and_bad_arguments_are_recorded_and_reraised_unchanged() -> None:
    monitor = Monitor()
    boom = ConnectionResetError("upstream closed")

    @monitor.track(model="m")
    def stream(n: int) -> Iterator[int]:
        yield n
        raise boom

    gen = stream(1)
    assert next(gen) == 1
    with pytest.raises(ConnectionResetError) as info:
        next(gen)
    assert info.value is boom
    with pytest.raises(StopIteration):
        next(gen)
    with pytest.raises(TypeError):
        list(stream(1, 2))  # type: ignore[call-arg]
    assert _stats(monitor) == (2, 0, {"ConnectionResetError": 1, "TypeError": 1})


def test_the_sdk_failing_never_breaks_the_users_stream() -> None:
    clock = Clock()
    monitor = Monitor(clock=clock)

    @monitor.track(model="m")
    def stream() -> Iterator[int]:
        yield from range(3)

    clock.broken = True
    assert list(stream()) == [0, 1, 2]
    assert monitor.counters.value("internal", "start") == 1
    gen = stream()
    clock.broken = False
    next(gen)  # started with a working clock ...
    clock.broken = True
    assert list(gen) == [1, 2]  # ... whose end it cannot read
    assert monitor.counters.value("internal", "finish") == 1


def test_methods_bind_like_functions_and_tracked_functions_pickle_by_name() -> None:
    monitor = Monitor()

    class Model:
        def __init__(self, n: int) -> None:
            self.n = n

        @monitor.track(model="m")
        def stream(self, k: int) -> Iterator[int]:
            yield from range(self.n * k)

        @monitor.track(model="m")
        async def astream(self) -> AsyncIterator[int]:
            yield self.n

    model = Model(2)
    assert list(model.stream(2)) == [0, 1, 2, 3]
    assert list(Model.stream(model, 1)) == [0, 1]
    assert inspect.ismethod(model.stream)

    async def collect() -> list[int]:
        return [i async for i in model.astream()]

    assert asyncio.run(collect()) == [2]
    assert pickle.loads(pickle.dumps(tokens_for_pickle)) is tokens_for_pickle
    assert _stats(monitor)[:2] == (3, 0)


def test_positional_and_keyword_arguments_reach_every_kind_of_function_as_given() -> None:
    monitor = Monitor()
    track = monitor.track(model="m")

    @track
    def plain(a: int, b: int = 2, *, c: int = 3) -> tuple[int, int, int]:
        return a, b, c

    @track
    async def coroutine(a: int, b: int = 2, *, c: int = 3) -> tuple[int, int, int]:
        return a, b, c

    @track
    def stream(a: int, b: int = 2, *, c: int = 3) -> Iterator[int]:
        yield from (a, b, c)

    @track
    async def astream(a: int, b: int = 2, *, c: int = 3) -> AsyncIterator[int]:
        for x in (a, b, c):
            yield x

    async def collect(agen: AsyncIterator[int]) -> list[int]:
        return [x async for x in agen]

    for args, kwargs, want in (
        ((1,), {}, (1, 2, 3)),
        ((1, 5), {"c": 6}, (1, 5, 6)),
        ((), {"a": 7, "b": 8}, (7, 8, 3)),
    ):
        assert plain(*args, **kwargs) == want
        assert asyncio.run(coroutine(*args, **kwargs)) == want
        assert tuple(stream(*args, **kwargs)) == want
        assert tuple(asyncio.run(collect(astream(*args, **kwargs)))) == want
    assert _stats(monitor) == (12, 0, {})


_PICKLE_MONITOR = Monitor()


@_PICKLE_MONITOR.track(model="m")
def tokens_for_pickle() -> Iterator[int]:
    yield 1


def test_nothing_is_kept_after_streams_end_however_they_end() -> None:
    monitor = Monitor()

    class Prompt:
        pass

    @monitor.track(model="m")
    def stream(prompt: Prompt, fail: bool) -> Iterator[int]:
        yield 1
        if fail:
            raise ValueError
        yield 2

    refs = []
    for how in ("exhaust", "close", "drop", "throw", "send", "error"):
        prompt = Prompt()
        refs.append(weakref.ref(prompt))
        gen = stream(prompt, how == "error")
        next(gen)
        if how == "exhaust":
            list(gen)
        elif how == "close":
            gen.close()
        elif how == "throw":
            with pytest.raises(KeyError):
                gen.throw(KeyError())
        elif how == "send":
            gen.send("x")
        elif how == "error":
            with pytest.raises(ValueError):
                next(gen)
        del gen, prompt
    gc.collect()
    assert [r() for r in refs] == [None] * 6
    codes = (stream.__code__, stream.__wrapped__.__code__)  # type: ignore[attr-defined]
    assert not [o for o in gc.get_objects() if isinstance(o, types.GeneratorType) and o.gi_code in codes]
    assert _stats(monitor) == (6, 0, {"KeyError": 1, "ValueError": 1})


def test_sampled_calls_keep_their_text_and_unsampled_ones_are_counted() -> None:
    got: list[InferenceRecord] = []
    monitor = Monitor(sink=got.extend, sample_rate=1.0)

    @monitor.track(model="m")
    def stream(prompt: str) -> Iterator[str]:
        yield prompt.upper()
        yield "!"

    assert list(stream("hi")) == ["HI", "!"]
    monitor.configure(sample_rate=0.0)
    assert list(stream("quiet")) == ["QUIET", "!"]
    assert monitor.flush(5)
    assert [(r.prompt, r.response, r.output_tokens) for r in got] == [("hi", "HI!", 2)]
    assert _stats(monitor) == (2, 0, {})


# -- async generators ---------------------------------------------------------------------------


async def test_async_exhaustion_close_and_drop() -> None:
    clock = Clock()
    monitor = Monitor(clock=clock)
    cleaned: list[int] = []

    @monitor.track(model="m")
    async def stream(n: int) -> AsyncIterator[int]:
        clock.t += 0.25
        try:
            for i in range(n):
                if i:
                    clock.t += 0.05
                await asyncio.sleep(0)
                yield i
        finally:
            cleaned.append(n)

    assert [i async for i in stream(4)] == [0, 1, 2, 3]
    assert [i async for i in stream(0)] == []
    closed = stream(50)
    assert await closed.__anext__() == 0
    await closed.aclose()
    await closed.aclose()
    assert monitor.stats.quantile("ttft", 0.5, 600) == pytest.approx(0.25, rel=0.02)
    assert monitor.stats.quantile("tpot", 0.5, 600) == pytest.approx(0.05, rel=0.02)
    with pytest.raises(StopAsyncIteration):
        await closed.__anext__()
    assert sorted(cleaned) == [0, 4, 50]
    assert _stats(monitor) == (3, 0, {})


async def test_async_asend_athrow_and_errors() -> None:
    # asend/athrow into a generator that uses them, and cancellation: tests/test_sdk_streams.py
    monitor = Monitor()

    @monitor.track(model="m")
    async def tokens() -> AsyncIterator[int]:
        yield 1
        await asyncio.sleep(0)
        yield 2

    @monitor.track(model="m")
    async def failing() -> AsyncIterator[int]:
        yield 1
        raise ConnectionResetError

    quiet = tokens()
    assert await quiet.asend(None) == 1
    assert await quiet.asend("dropped") == 2
    thrown = tokens()
    assert await thrown.__anext__() == 1
    with pytest.raises(ValueError):
        await thrown.athrow(ValueError("stop"))
    with pytest.raises(ConnectionResetError):
        async for _ in failing():
            pass
    await quiet.aclose()
    with pytest.raises(StopAsyncIteration):
        await quiet.asend(None)
    assert _stats(monitor) == (3, 0, {"ValueError": 1, "ConnectionResetError": 1})


async def test_async_streams_keep_nothing_after_they_end() -> None:
    monitor = Monitor()

    class Prompt:
        pass

    @monitor.track(model="m")
    async def stream(prompt: Prompt) -> AsyncIterator[int]:
        yield 1
        yield 2

    refs = []
    for how in ("exhaust", "aclose", "athrow"):
        prompt = Prompt()
        refs.append(weakref.ref(prompt))
        agen = stream(prompt)
        assert await agen.__anext__() == 1
        if how == "exhaust":
            assert [i async for i in agen] == [2]
        elif how == "aclose":
            await agen.aclose()
        else:
            with pytest.raises(KeyError):
                await agen.athrow(KeyError())
        del agen, prompt
    gc.collect()
    assert [r() for r in refs] == [None] * 3
    assert _stats(monitor) == (3, 0, {"KeyError": 1})
