"""The decorator's lock-free recording: what several threads observe is what is merged at
scrape (nothing lost, nothing counted twice), and the cheap loops for streams whose text is
not sampled record what the general one records (TTFT, TPOT, items; closes and errors)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from ddsketch import DDSketch
from ddsketch.mapping import LogarithmicMapping
from infersight.collectors._series import add_keys
from infersight.monitor.sdk import Monitor
from infersight.monitor.sdk._streams import drops_sent_values, returns_only_none
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _value(monitor: Monitor, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(generate_latest(monitor.registry).decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no sample {name} {labels}")


def test_threads_recording_while_others_scrape_lose_nothing_and_count_nothing_twice() -> None:
    monitor = Monitor()

    @monitor.track(model="m")
    def answer(i: int) -> int:
        return i

    @monitor.track(model="m")
    def stream(n: int) -> Iterator[int]:
        for i in range(n):  # noqa: UP028 (a token stream's shape: the pass-through path)
            yield i

    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            generate_latest(monitor.registry)
            monitor.stats.in_flight()

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for i in range(3000):
            answer(i)
            for _ in stream(rng.randint(1, 3)):
                pass

    scrapers = [threading.Thread(target=scrape) for _ in range(2)]
    workers = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in scrapers + workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    for t in scrapers:
        t.join()
    rngs = [random.Random(seed) for seed in range(4)]
    items = sum(r.randint(1, 3) for r in rngs for _ in range(3000))
    assert monitor.stats.count(60) == 24_000 and monitor.stats.in_flight() == 0
    count = _value(monitor, "gen_ai_server_request_duration_seconds_count", model="m")
    assert count == 24_000
    assert _value(monitor, "gen_ai_server_token_usage_sum", gen_ai_token_type="output") == items
    assert _value(monitor, "gen_ai_server_time_to_first_token_seconds_count") == 12_000


def test_a_stream_not_sampled_reports_ttft_tpot_and_items() -> None:
    clock = Clock()
    monitor = Monitor(clock=clock)

    @monitor.track(model="m")
    def stream(n: int) -> Iterator[str]:
        clock.t += 0.4
        for i in range(n):
            if i:
                clock.t += 0.05
            yield f"t{i}"

    gen = stream(5)
    assert next(gen) == "t0" and monitor.stats.in_flight() == 1
    assert list(gen) == ["t1", "t2", "t3", "t4"]
    assert monitor.stats.in_flight() == 0 and monitor.stats.count(60) == 1
    assert monitor.stats.quantile("ttft", 0.5, 60) == pytest.approx(0.4, rel=0.01)
    assert monitor.stats.quantile("tpot", 0.5, 60) == pytest.approx(0.05, rel=0.01)
    assert monitor.stats.quantile("request_duration", 0.5, 60) == pytest.approx(0.6, rel=0.01)
    assert _value(monitor, "gen_ai_server_token_usage_sum", gen_ai_token_type="output") == 5
    assert list(stream(0)) == [] and monitor.stats.count(60) == 2


def test_single_item_streams_have_no_tpot_when_folded_beside_longer_ones() -> None:
    clock = Clock()
    monitor = Monitor(clock=clock)

    @monitor.track(model="m")
    def stream(n: int) -> Iterator[int]:
        clock.t += 0.2
        for i in range(n):
            if i:
                clock.t += 0.03
            yield i

    for n in (1, 3, 1):
        assert list(stream(n)) == list(range(n))
    assert monitor.stats.count(60) == 3
    assert _value(monitor, "gen_ai_server_time_per_output_token_seconds_count") == 1
    assert monitor.stats.quantile("tpot", 0.5, 60) == pytest.approx(0.03, rel=0.01)
    assert monitor.stats.quantile("ttft", 0.5, 60) == pytest.approx(0.2, rel=0.01)
    assert _value(monitor, "gen_ai_server_token_usage_sum", gen_ai_token_type="output") == 5


def test_a_stream_not_sampled_hands_on_throw_close_and_its_errors() -> None:
    monitor = Monitor()
    cleaned = []

    @monitor.track(model="m")
    def stream() -> Iterator[int]:
        i = 0
        try:
            while i < 1000:
                try:
                    yield i
                except KeyError:
                    i = 100
                    yield -1
                i += 1
        finally:
            cleaned.append(i)

    gen = stream()
    assert [next(gen), gen.send("ignored"), gen.send("dropped"), next(gen)] == [0, 1, 2, 3]
    assert gen.throw(KeyError("k")) == -1 and next(gen) == 101 and gen.send(None) == 102
    gen.close()
    assert cleaned == [102] and monitor.stats.error_counts() == {}
    assert _value(monitor, "gen_ai_server_token_usage_sum", gen_ai_token_type="output") == 7

    @monitor.track(model="m")
    def broken() -> Iterator[int]:
        yield 1
        yield 2
        raise ConnectionResetError("gone")

    with pytest.raises(ConnectionResetError):
        list(broken())
    assert monitor.stats.count(60) == 2 and monitor.stats.error_counts() == {"ConnectionResetError": 1}
    assert monitor.stats.in_flight() == 0


def test_sent_values_reach_a_generator_that_delegates_with_yield_from() -> None:
    monitor = Monitor()

    def inner() -> Iterator[int]:
        total = 0
        while total < 100:
            total += (yield total) or 0

    @monitor.track(model="m")
    def outer() -> Iterator[int]:
        yield from inner()

    gen = outer()
    assert next(gen) == 0 and next(gen) == 0
    assert gen.send(7) == 7 and gen.send(5) == 12
    with pytest.raises(StopIteration):
        gen.send(100)
    assert monitor.stats.count(60) == 1 and monitor.stats.error_counts() == {}


def test_the_bytecode_reading_picks_the_pass_through_only_where_it_is_exact() -> None:
    def tokens() -> Iterator[int]:
        for i in range(3):  # noqa: UP028 (what is read is this form)
            yield i

    def delegates() -> Iterator[int]:
        yield from range(3)

    def uses_sent() -> Any:
        got = yield 1
        yield got

    def returns() -> Any:
        yield 1
        return 5

    def maybe_returns(flag: bool) -> Any:
        yield 1
        return 5 if flag else None

    assert returns_only_none(tokens) and drops_sent_values(tokens)
    assert returns_only_none(delegates) and not drops_sent_values(delegates)
    assert not drops_sent_values(uses_sent)
    assert not returns_only_none(returns) and not returns_only_none(maybe_returns)
    assert not returns_only_none(len) and not drops_sent_values(len)


async def test_an_async_stream_not_sampled_reports_items_and_hands_on_asend() -> None:
    clock = Clock()
    monitor = Monitor(clock=clock)

    @monitor.track(model="m")
    async def stream() -> AsyncIterator[int]:
        total = 0
        clock.t += 0.2
        for _ in range(4):
            got = yield total
            clock.t += 0.1
            total += got or 1
            await asyncio.sleep(0)

    agen = stream()
    assert [await agen.__anext__(), await agen.__anext__()] == [0, 1]
    assert await agen.asend(10) == 11
    assert [v async for v in agen] == [12]
    assert monitor.stats.count(60) == 1 and monitor.stats.in_flight() == 0
    assert monitor.stats.quantile("ttft", 0.5, 60) == pytest.approx(0.2, rel=0.01)
    assert monitor.stats.quantile("tpot", 0.5, 60) == pytest.approx(0.4 / 3, rel=0.01)
    assert _value(monitor, "gen_ai_server_token_usage_sum", gen_ai_token_type="output") == 4


def test_an_async_stream_that_awaits_but_drops_sent_values_takes_the_pass_through() -> None:
    async def tokens() -> AsyncIterator[int]:
        async with asyncio.timeout(60):
            for i in range(3):
                await asyncio.sleep(0)
                yield i

    async def uses_sent() -> AsyncIterator[Any]:
        await asyncio.sleep(0)
        got = yield 1
        yield got

    assert drops_sent_values(tokens) and not drops_sent_values(uses_sent)


async def test_an_async_pass_through_stream_drops_sent_values_and_hands_on_athrow_and_aclose() -> None:
    clock = Clock()
    monitor = Monitor(clock=clock)
    cleaned = []

    @monitor.track(model="m")
    async def stream() -> AsyncIterator[int]:
        i = 0
        clock.t += 0.3
        try:
            while i < 1000:
                await asyncio.sleep(0)
                try:
                    yield i
                except KeyError:
                    i = 100
                    yield -1
                clock.t += 0.1
                i += 1
        finally:
            cleaned.append(i)

    agen = stream()
    assert [await agen.__anext__(), await agen.asend("dropped"), await agen.asend(None)] == [0, 1, 2]
    assert await agen.athrow(KeyError("k")) == -1 and await agen.asend("x") == 101
    await agen.aclose()
    assert cleaned == [101] and monitor.stats.error_counts() == {} and monitor.stats.in_flight() == 0
    assert monitor.stats.count(60) == 1
    assert monitor.stats.quantile("ttft", 0.5, 60) == pytest.approx(0.3, rel=0.01)
    assert _value(monitor, "gen_ai_server_token_usage_sum", gen_ai_token_type="output") == 5

    @monitor.track(model="m")
    async def tokens(n: int) -> AsyncIterator[str]:
        clock.t += 0.5
        for i in range(n):
            if i:
                clock.t += 0.02
            await asyncio.sleep(0)
            yield f"t{i}"

    assert [t async for t in tokens(6)] == [f"t{i}" for i in range(6)]
    assert [t async for t in tokens(0)] == []
    assert monitor.stats.count(60) == 3 and monitor.stats.in_flight() == 0
    assert monitor.stats.quantile("tpot", 0.5, 60) == pytest.approx(0.02, rel=0.01)
    assert _value(monitor, "gen_ai_server_token_usage_sum", gen_ai_token_type="output") == 11

    @monitor.track(model="m")
    async def broken() -> AsyncIterator[int]:
        yield 1
        await asyncio.sleep(0)
        raise ConnectionResetError("gone")

    with pytest.raises(ConnectionResetError):
        [v async for v in broken()]
    assert monitor.stats.error_counts() == {"ConnectionResetError": 1} and monitor.stats.in_flight() == 0


def test_adding_a_batch_of_values_to_a_sketch_equals_adding_them_one_at_a_time() -> None:
    import numpy as np

    rng = random.Random(3)
    values = [0.0] * 5 + [rng.lognormvariate(-4, 2) for _ in range(3000)]
    one_by_one, batch = DDSketch(0.01), DDSketch(0.01)
    for v in values:
        one_by_one.add(v)
    mapping = LogarithmicMapping(0.01)
    array = np.array(values)
    zero = array <= mapping.min_possible
    keys = np.zeros(len(array), dtype=np.int64)
    keys[~zero] = [mapping.key(v) for v in array[~zero]]
    add_keys(batch, keys[:1000], zero[:1000], array[:1000])
    add_keys(batch, keys[1000:], zero[1000:], array[1000:])
    assert batch.count == one_by_one.count and batch.sum == pytest.approx(one_by_one.sum)
    for q in (0.0, 0.01, 0.1, 0.5, 0.9, 0.99, 1.0):
        assert batch.get_quantile_value(q) == one_by_one.get_quantile_value(q)
