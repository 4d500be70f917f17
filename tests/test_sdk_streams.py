"""@track on generators and async generators: streamed tokens, TTFT and TPOT, and the call
finished on exhaustion, close, error or cancellation."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from infersight.monitor.records import InferenceRecord
from infersight.monitor.sdk import Monitor


class Clock:
    def __init__(self) -> None:
        self.t = 10.0

    def __call__(self) -> float:
        return self.t


def _monitor(clock: Clock) -> tuple[Monitor, list[InferenceRecord]]:
    got: list[InferenceRecord] = []
    return Monitor(clock=clock, sink=got.extend, sample_rate=1.0), got


def test_generator_reports_ttft_tpot_tokens_and_response() -> None:
    clock = Clock()
    monitor, got = _monitor(clock)

    @monitor.track(model="m", model_version="v1")
    def stream(prompt: str, n: int = 4) -> Iterator[str]:
        clock.t += 0.3  # prefill
        for i in range(n):
            if i:
                clock.t += 0.02
            yield f"t{i} "

    assert inspect.isgeneratorfunction(stream)
    assert inspect.signature(stream) == inspect.signature(stream.__wrapped__)
    assert list(stream("hello")) == ["t0 ", "t1 ", "t2 ", "t3 "]
    assert monitor.flush(5)
    (record,) = got
    assert record.ttft_s == pytest.approx(0.3) and record.tpot_s == pytest.approx(0.02)
    assert record.duration_s == pytest.approx(0.36) and record.output_tokens == 4
    assert (record.prompt, record.response) == ("hello", "t0 t1 t2 t3 ")
    assert monitor.stats.quantile("tpot", 0.5, 60) == pytest.approx(0.02, rel=0.01)


def test_generator_closed_early_is_finished_without_error_and_its_cleanup_runs() -> None:
    monitor = Monitor()
    cleaned = []

    @monitor.track(model="m")
    def stream() -> Iterator[int]:
        try:
            yield from range(100)
        finally:
            cleaned.append(True)

    gen = stream()
    assert [next(gen), next(gen)] == [0, 1]
    assert monitor.stats.in_flight() == 1
    gen.close()
    assert cleaned == [True]
    assert monitor.stats.in_flight() == 0 and monitor.stats.count(60) == 1
    assert monitor.stats.error_counts() == {}


def test_send_throw_and_return_value_are_delegated_like_yield_from() -> None:
    monitor = Monitor()

    @monitor.track(model="m")
    def echo() -> Any:
        total = 0
        while True:
            try:
                got = yield total
            except ValueError:
                total = -1
                continue
            if got is None:
                return total
            total += got

    gen = echo()
    assert next(gen) == 0
    assert gen.send(5) == 5
    assert gen.throw(ValueError("reset")) == -1
    with pytest.raises(StopIteration) as stop:
        gen.send(None)
    assert stop.value.value == -1
    assert monitor.stats.count(60) == 1 and monitor.stats.error_counts() == {}


def test_generator_error_mid_stream_is_recorded_and_reraised_unchanged() -> None:
    monitor = Monitor()
    boom = ConnectionResetError("upstream closed")

    @monitor.track(model="m")
    def stream() -> Iterator[str]:
        yield "a"
        raise boom

    gen = stream()
    assert next(gen) == "a"
    with pytest.raises(ConnectionResetError) as info:
        next(gen)
    assert info.value is boom
    assert monitor.stats.error_counts() == {"ConnectionResetError": 1}


async def test_async_generator_reports_ttft_and_keeps_its_kind() -> None:
    clock = Clock()
    monitor, got = _monitor(clock)

    @monitor.track(model="m")
    async def stream(prompt: str) -> AsyncIterator[str]:
        clock.t += 0.1
        yield "x"
        clock.t += 0.05
        yield "y"

    assert inspect.isasyncgenfunction(stream)
    assert inspect.signature(stream) == inspect.signature(stream.__wrapped__)
    assert [t async for t in stream("p")] == ["x", "y"]
    assert monitor.flush(5)
    assert got[0].ttft_s == pytest.approx(0.1) and got[0].tpot_s == pytest.approx(0.05)
    assert got[0].response == "xy"


async def test_async_generator_aclose_finishes_the_call_without_error() -> None:
    monitor = Monitor()
    cleaned = []

    @monitor.track(model="m")
    async def stream() -> AsyncIterator[int]:
        try:
            for i in range(100):
                yield i
        finally:
            cleaned.append(True)

    agen = stream()
    assert await agen.__anext__() == 0
    await agen.aclose()
    assert cleaned == [True] and monitor.stats.in_flight() == 0
    assert monitor.stats.count(60) == 1 and monitor.stats.error_counts() == {}


async def test_cancelling_the_consumer_of_an_async_stream_is_recorded_as_cancelled() -> None:
    monitor = Monitor()
    first = asyncio.Event()

    @monitor.track(model="m")
    async def stream() -> AsyncIterator[int]:
        yield 1
        first.set()
        await asyncio.sleep(60)
        yield 2

    async def consume() -> None:
        async for _ in stream():
            pass

    task = asyncio.create_task(consume())
    await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert monitor.stats.error_counts() == {"CancelledError": 1}
    assert monitor.stats.in_flight() == 0


async def test_async_generator_athrow_and_asend_are_delegated() -> None:
    monitor = Monitor()

    @monitor.track(model="m")
    async def acc() -> AsyncIterator[int]:
        total = 0
        while True:
            try:
                got = yield total
            except KeyError:
                total = 100
                continue
            total += got or 0

    agen = acc()
    assert await agen.asend(None) == 0
    assert await agen.asend(3) == 3
    assert await agen.athrow(KeyError("k")) == 100
    await agen.aclose()
    assert monitor.stats.count(60) == 1
