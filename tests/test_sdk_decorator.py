"""@track on plain functions and coroutines, as a context manager, and its promise never to
raise into the user's call."""

from __future__ import annotations

import asyncio
import inspect
import threading
import traceback
from typing import Any

import pytest
from infersight.monitor.sdk import Monitor, SDKConfigError


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def test_sync_function_keeps_signature_and_records_its_latency() -> None:
    clock = Clock()
    monitor = Monitor(clock=clock)

    @monitor.track(model="fraud", model_version="v3")
    def answer(prompt: str, *, temperature: float = 0.0) -> str:
        """Answer."""
        clock.t += 0.25
        return prompt[::-1]

    assert answer("abc", temperature=0.5) == "cba"
    assert inspect.signature(answer) == inspect.signature(answer.__wrapped__)
    assert answer.__name__ == "answer" and answer.__doc__ == "Answer."
    assert not inspect.iscoroutinefunction(answer)
    assert monitor.stats.count(60, model="fraud", model_version="v3") == 1
    assert monitor.stats.quantile("request_duration", 0.5, 60) == pytest.approx(0.25, rel=0.01)
    assert monitor.stats.in_flight() == 0


async def test_coroutine_stays_a_coroutine_function_and_is_timed_across_awaits() -> None:
    clock = Clock()
    monitor = Monitor(clock=clock)

    @monitor.track(model="m")
    async def answer(prompt: str) -> str:
        await asyncio.sleep(0)
        clock.t += 1.5
        return prompt

    assert inspect.iscoroutinefunction(answer)
    assert inspect.signature(answer) == inspect.signature(answer.__wrapped__)
    assert await answer("x") == "x"
    assert monitor.stats.quantile("request_duration", 0.5, 60) == pytest.approx(1.5, rel=0.01)


def test_user_exception_is_recorded_then_reraised_unchanged() -> None:
    monitor = Monitor()

    class FraudModelDown(RuntimeError):
        pass

    raised = FraudModelDown("backend gone")

    @monitor.track(model="m")
    def answer(prompt: str) -> str:
        raise raised

    with pytest.raises(FraudModelDown) as info:
        answer("x")
    assert info.value is raised
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert "raise raised" in "".join(traceback.format_tb(info.value.__traceback__))
    assert monitor.stats.count(60, errors_only=True) == 1
    assert monitor.stats.error_counts() == {"FraudModelDown": 1}


async def test_cancelled_coroutine_is_recorded_as_cancelled_and_still_cancels() -> None:
    monitor = Monitor()
    started = asyncio.Event()

    @monitor.track(model="m")
    async def slow() -> None:
        started.set()
        await asyncio.sleep(60)

    task = asyncio.create_task(slow())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert monitor.stats.error_counts() == {"CancelledError": 1}
    assert monitor.stats.in_flight() == 0


def test_bookkeeping_failures_never_reach_the_caller() -> None:
    def broken_clock() -> float:
        raise OSError("clock is gone")

    monitor = Monitor(clock=broken_clock)

    @monitor.track(model="m")
    def answer(prompt: str) -> str:
        return prompt.upper()

    assert answer("ok") == "OK"
    with monitor.track(model="m") as call:
        call.token()
        call.set_response("fine")
    assert monitor.counters.value("internal", "start") == 2
    assert monitor.stats.in_flight() == 0  # nothing left counted as running


def test_failing_statistics_or_extractors_never_reach_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any) -> Any:
        raise RuntimeError("extractor bug")

    monitor = Monitor(sink=lambda records: None, sample_rate=1.0, extract_prompt=boom, extract_response=boom)

    @monitor.track(model="m")
    def answer(prompt: str) -> str:
        return prompt

    assert answer("a") == "a"

    class BrokenBuffer(list):
        def extend(self, items: Any) -> None:
            raise MemoryError("buffer bug")

    monkeypatch.setattr(monitor.stats.series("m", "unknown"), "timed", BrokenBuffer())

    @monitor.track(model="m")
    def answer_again(prompt: str) -> str:  # wrapped after the break: it holds the broken buffer
        return prompt

    assert answer_again("b") == "b"
    assert monitor.counters.value("internal", "extract_prompt") == 1
    assert monitor.counters.value("internal", "finish") == 1


def test_context_manager_makes_fresh_state_per_use_and_nests() -> None:
    clock = Clock()
    monitor = Monitor(clock=clock)
    tracker = monitor.track(model="m")
    with tracker as outer:
        clock.t += 1.0
        with tracker as inner:
            clock.t += 0.5
            inner.token()
        clock.t += 1.0
    assert outer is not inner
    assert monitor.stats.count(60) == 2
    assert monitor.stats.quantile("request_duration", 0.0, 60) == pytest.approx(0.5, rel=0.01)
    assert monitor.stats.quantile("request_duration", 1.0, 60) == pytest.approx(2.5, rel=0.01)
    assert monitor.stats.quantile("ttft", 0.5, 60) == pytest.approx(0.5, rel=0.01)


def test_context_manager_records_and_propagates_an_exception() -> None:
    monitor = Monitor()
    with pytest.raises(KeyError), monitor.track(model="m"):
        raise KeyError("k")
    assert monitor.stats.error_counts() == {"KeyError": 1}


async def test_async_context_manager_is_per_task() -> None:
    monitor = Monitor()
    tracker = monitor.track(model="m")

    async def one(i: int) -> None:
        async with tracker as call:
            await asyncio.sleep(0.001 * (i % 3))
            call.set_token_counts(prompt_tokens=i, output_tokens=1)

    await asyncio.gather(*(one(i) for i in range(20)))
    assert monitor.stats.count(60) == 20 and monitor.stats.in_flight() == 0


def test_concurrent_threads_lose_no_calls() -> None:
    monitor = Monitor()

    @monitor.track(model="m")
    def answer(i: int) -> int:
        return i

    def work() -> None:
        for i in range(2000):
            answer(i)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert monitor.stats.count(60) == 12_000 and monitor.stats.in_flight() == 0


def test_bare_decorator_names_the_model_after_the_function() -> None:
    monitor = Monitor()

    @monitor.track
    def classify(text: str) -> str:
        return "ok"

    classify("x")
    assert monitor.stats.labels() == [
        ("test_bare_decorator_names_the_model_after_the_function.<locals>.classify", "unknown")
    ]


@pytest.mark.parametrize(
    "options",
    [
        {"sample_rate": 2.0},
        {"sample_rate": 0.5},
        {"queue_size": 0},
        {"max_text_chars": 10**9},
        {"colour": "red"},
    ],
)
def test_bad_options_raise_a_typed_error_at_set_up(options: dict[str, Any]) -> None:
    with pytest.raises(SDKConfigError):
        Monitor(**options)


def test_bad_labels_raise_at_decoration_not_at_call_time() -> None:
    monitor = Monitor()
    with pytest.raises(SDKConfigError, match="model_version"):
        monitor.track(model="m", model_version="")
    with pytest.raises(SDKConfigError, match="model"):
        monitor.track(model="")


class _Answer:
    def __init__(self, id: Any) -> None:
        self.id = id


async def test_request_id_names_the_sampled_record_and_a_bad_one_falls_back_counted() -> None:
    got: list[Any] = []
    monitor = Monitor(sink=got.extend, sample_rate=1.0)
    by_id = monitor.track(model="m", request_id=lambda answer: answer.id)

    @by_id
    def plain(rid: Any) -> _Answer:
        return _Answer(rid)

    @by_id
    async def coro(rid: Any) -> _Answer:
        return _Answer(rid)

    @monitor.track(model="m", request_id=lambda chunks: chunks[0].id)  # a stream: its items
    def stream(rid: str) -> Any:
        yield _Answer(rid)
        yield _Answer(rid)

    assert plain("chatcmpl-1").id == "chatcmpl-1"
    assert (await coro("chatcmpl-2")).id == "chatcmpl-2"
    assert [c.id for c in stream("chatcmpl-3")] == ["chatcmpl-3", "chatcmpl-3"]
    with monitor.track(model="m") as call:
        call.set_request_id("chatcmpl-4")
    assert plain(None).id is None  # not a string: the generated id, counted
    assert plain("x" * 257).id == "x" * 257  # longer than feedback accepts: the same
    plain_boom = monitor.track(model="m", request_id=lambda answer: 1 / 0)(lambda: _Answer("a"))
    assert plain_boom().id == "a"  # the callable raised: never into the user's call
    with monitor.track(model="m") as call:
        call.set_request_id(42)
    assert monitor.flush(5.0)
    monitor.close(1.0)
    ids = [r.request_id for r in got]
    assert ids[:4] == ["chatcmpl-1", "chatcmpl-2", "chatcmpl-3", "chatcmpl-4"]
    assert len(ids) == 8 and len(set(ids)) == 8 and not any(i.startswith("x") for i in ids[4:])
    assert monitor.counters.value("internal", "request_id") == 4
    with pytest.raises(SDKConfigError, match="request_id"):
        monitor.track(model="m", request_id="id")  # type: ignore[arg-type]
