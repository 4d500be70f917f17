"""The serving runtime on a real tiny Mixtral: batching, priorities, streaming, stops, events."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import _engine_serving_support as support
import pytest
from _engine_serving_support import V1, Recorder, prompt
from infersight.engine.errors import InvalidRequest, PromptTooLong, RuntimeNotRunning
from infersight.engine.events import (
    RequestFailed,
    RequestFinished,
    RequestQueued,
    RequestStarted,
    TokenEmitted,
)
from infersight.engine.registry import Registry
from infersight.engine.runtime import Runtime

Greedy = Callable[[str, list[int], int], list[int]]
tiny_checkpoints, registry, greedy, runtime = (
    support.tiny_checkpoints,
    support.registry,
    support.greedy,
    support.runtime,
)  # fixtures


def test_greedy_output_does_not_depend_on_who_shares_the_batch(runtime: Runtime, greedy: Greedy) -> None:
    long = prompt(1, 9)
    first = runtime.submit(long, max_new_tokens=40)
    next(iter(first))  # running: the others join a batch already decoding
    others = [(prompt(10 + i, 3 + 2 * i), 6 + 5 * i) for i in range(6)]  # 7 requests > 4 slots
    handles = [runtime.submit(p, max_new_tokens=n) for p, n in others]
    assert first.result(timeout=60).token_ids == tuple(greedy(V1, long, 40))
    for (p, n), handle in zip(others, handles, strict=True):
        done = handle.result(timeout=60)
        assert done.token_ids == tuple(greedy(V1, p, n)), f"prompt {p}"
        assert done.finish_reason == "length" and done.model_version == V1


def test_higher_priority_is_scheduled_first_and_fifo_within_a_priority(registry: Registry) -> None:
    rt = Runtime(registry, max_batch_size=1, max_prompt_tokens=32, max_seq_len=64)
    events = Recorder()
    rt.subscribe(events)
    rt.start(V1)
    try:
        blocker = rt.submit(prompt(0, 4), max_new_tokens=55, request_id="blocker")
        next(iter(blocker))  # it holds the only slot while the rest queue
        order = [("low", 0), ("high-a", 5), ("mid", 1), ("high-b", 5), ("neg", -3)]
        handles = [rt.submit(prompt(1, 4), max_new_tokens=2, priority=p, request_id=r) for r, p in order]
        assert rt.queue_depth == 5
        for h in handles:
            h.result(timeout=60)
    finally:
        rt.stop(drain=False)
    started = [e.request_id for e in events.of(RequestStarted)]
    assert started == ["blocker", "high-a", "high-b", "mid", "low", "neg"]
    queued = {e.request_id: e.priority for e in events.of(RequestQueued)}
    assert queued["high-b"] == 5 and queued["neg"] == -3


def test_tokens_stream_in_order_to_sync_and_async_readers(runtime: Runtime, greedy: Greedy) -> None:
    p = prompt(3, 5)
    handle = runtime.submit(p, max_new_tokens=12)
    streamed = list(handle)

    async def read() -> tuple[list[int], tuple[int, ...]]:
        again = [t async for t in handle]  # a second reader starts from the first token
        live = runtime.submit(p, max_new_tokens=12)
        live_tokens = [t async for t in live]
        assert (await live.aresult()).token_ids == tuple(live_tokens)
        return again, (await handle.aresult()).token_ids

    again, final = asyncio.run(read())
    assert streamed == again == list(final) == greedy(V1, p, 12)


def test_tokens_reach_an_async_reader_before_the_request_finishes(runtime: Runtime) -> None:
    async def read() -> tuple[int, bool]:
        handle = runtime.submit(prompt(4, 5), max_new_tokens=50)
        async for _ in handle:
            return 1, handle.done()
        return 0, True

    got, done_at_first = asyncio.run(read())
    assert got == 1 and not done_at_first


def test_generation_stops_at_the_eos_token(
    tmp_path: Path, tiny_checkpoints: dict[str, Path], greedy: Greedy
) -> None:
    p = prompt(5, 6)
    free_run = greedy(V1, p, 8)
    eos = next(t for i, t in enumerate(free_run) if i >= 2 and t not in free_run[:i])
    ckpt = tmp_path / "eos"
    shutil.copytree(tiny_checkpoints[V1], ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["eos_token_id"] = eos
    (ckpt / "config.json").write_text(json.dumps(config))
    reg = Registry(tmp_path / "reg")
    reg.register(V1, ckpt)
    with Runtime(reg, max_batch_size=2, max_seq_len=64, max_prompt_tokens=32) as rt:
        rt.start(V1)
        assert rt.eos_token_ids == frozenset({eos})
        done = rt.submit(p, max_new_tokens=8).result(timeout=60)
    assert done.finish_reason == "stop"
    assert done.token_ids == tuple(free_run[: free_run.index(eos) + 1])  # the EOS token is the last one


def test_max_new_tokens_ends_the_request_with_reason_length(runtime: Runtime) -> None:
    for n in (1, 2, 7):
        done = runtime.submit(prompt(6, 4), max_new_tokens=n).result(timeout=60)
        assert done.finish_reason == "length" and done.output_tokens == n


def test_cancel_stops_a_running_request_and_removes_a_queued_one(registry: Registry) -> None:
    rt = Runtime(registry, max_batch_size=1, max_prompt_tokens=32, max_seq_len=64)
    events = Recorder()
    rt.subscribe(events)
    rt.start(V1)
    try:
        running = rt.submit(prompt(7, 4), max_new_tokens=60, request_id="running")
        queued = rt.submit(prompt(8, 4), max_new_tokens=5, request_id="queued")
        tokens = iter(running)
        next(tokens), next(tokens)
        queued.cancel()
        running.cancel()
        r, q = running.result(timeout=30), queued.result(timeout=30)
        after = rt.submit(prompt(9, 4), max_new_tokens=3).result(timeout=30)  # the slot is free again
    finally:
        rt.stop(drain=False)
    assert r.finish_reason == "cancelled" and 2 <= r.output_tokens < 60
    assert q.finish_reason == "cancelled" and q.token_ids == () and q.ttft_s is None
    assert not events.of(RequestStarted, "queued")
    finished = events.of(RequestFinished, "queued")
    assert len(finished) == 1 and finished[0].finish_reason == "cancelled" and finished[0].ttft_s is None
    assert after.finish_reason == "length"
    running.cancel()  # a no-op once finished
    assert running.result().finish_reason == "cancelled"


def test_too_long_request_is_refused_at_submit_before_the_model(runtime: Runtime) -> None:
    events = Recorder()
    runtime.subscribe(events)
    with pytest.raises(PromptTooLong, match="max_prompt_tokens=32") as over_prompt:
        runtime.submit(list(range(33)), max_new_tokens=1, request_id="p33")
    assert (over_prompt.value.limit_name, over_prompt.value.limit, over_prompt.value.got) == (
        "max_prompt_tokens",
        32,
        33,
    )
    with pytest.raises(PromptTooLong, match="max_seq_len=64") as over_seq:
        runtime.submit(list(range(30)), max_new_tokens=35, request_id="s65")
    assert (over_seq.value.limit_name, over_seq.value.got) == ("max_seq_len", 65)
    runtime.submit(list(range(30)), max_new_tokens=34).result(timeout=60)  # exactly at the limit
    for bad in (
        {"max_new_tokens": 0},
        {"max_new_tokens": 2, "top_p": 0.0},
        {"max_new_tokens": 2, "temperature": -1},
    ):
        with pytest.raises(InvalidRequest):
            runtime.submit([1, 2], **bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="empty"):
        runtime.submit([], max_new_tokens=2)
    with pytest.raises(InvalidRequest, match=r"\[0, 96\)"):
        runtime.submit([1, 96], max_new_tokens=2)
    deadline = time.monotonic() + 10
    while len(events.of(RequestFailed)) < 7 and time.monotonic() < deadline:
        time.sleep(0.01)
    failed = {e.request_id: e.error_type for e in events.of(RequestFailed)}
    assert failed["p33"] == failed["s65"] == "PromptTooLong"
    assert not events.of(RequestQueued, "p33") and not events.of(RequestStarted, "p33")


def test_subscribers_see_queued_started_tokens_finished_with_consistent_timings(runtime: Runtime) -> None:
    events = Recorder()
    unsubscribe = runtime.subscribe(events)
    done = runtime.submit(prompt(11, 6), max_new_tokens=5, request_id="r1", priority=2).result(timeout=60)
    deadline = time.monotonic() + 10
    while not events.of(RequestFinished, "r1") and time.monotonic() < deadline:
        time.sleep(0.01)
    seq = events.for_request("r1")
    assert [type(e).__name__ for e in seq] == ["RequestQueued", "RequestStarted"] + ["TokenEmitted"] * 5 + [
        "RequestFinished"
    ]
    queued, started, tokens, finished = seq[0], seq[1], seq[2:7], seq[7]
    assert isinstance(queued, RequestQueued) and queued.prompt_tokens == 6 and queued.priority == 2
    assert isinstance(started, RequestStarted) and started.queue_s >= 0
    assert all(isinstance(t, TokenEmitted) for t in tokens)
    assert [t.index for t in tokens] == list(range(5))  # type: ignore[union-attr]
    assert [t.token_id for t in tokens] == list(done.token_ids)  # type: ignore[union-attr]
    since = [t.since_start_s for t in tokens]  # type: ignore[union-attr]
    assert since == sorted(since) and since[0] >= started.queue_s
    assert isinstance(finished, RequestFinished)
    assert (finished.prompt_tokens, finished.output_tokens, finished.finish_reason) == (6, 5, "length")
    assert finished.ttft_s == pytest.approx(since[0]) and finished.duration_s == pytest.approx(since[-1])
    assert finished.queue_s == pytest.approx(started.queue_s)
    assert queued.at <= started.at <= finished.at and finished.model_version == V1
    assert (done.ttft_s, done.duration_s, done.queue_s) == (
        finished.ttft_s,
        finished.duration_s,
        finished.queue_s,
    )
    unsubscribe()
    runtime.submit(prompt(12, 3), max_new_tokens=2, request_id="r2").result(timeout=60)
    time.sleep(0.05)
    assert not events.for_request("r2")


def test_a_failing_subscriber_is_counted_and_serving_goes_on(runtime: Runtime, greedy: Greedy) -> None:
    def broken(event: object) -> None:
        raise RuntimeError("subscriber bug")

    events = Recorder()
    runtime.subscribe(broken)
    runtime.subscribe(events)  # subscribed after the broken one: still called
    p = prompt(13, 4)
    done = runtime.submit(p, max_new_tokens=4).result(timeout=60)
    assert done.token_ids == tuple(greedy(V1, p, 4))
    deadline = time.monotonic() + 10
    while not events.of(RequestFinished) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runtime.subscriber_errors >= 7  # queued, started, 4 tokens, finished
    assert len(events.of(TokenEmitted)) == 4


def test_seeded_sampling_gives_the_same_tokens_alone_and_in_a_batch(runtime: Runtime) -> None:
    p = prompt(14, 5)
    alone = runtime.submit(p, max_new_tokens=10, temperature=1.0, top_p=0.9, seed=7).result(timeout=60)
    crowd = [runtime.submit(prompt(20 + i, 4), max_new_tokens=12, temperature=1.0) for i in range(3)]
    batched = runtime.submit(p, max_new_tokens=10, temperature=1.0, top_p=0.9, seed=7).result(timeout=60)
    other_seed = runtime.submit(p, max_new_tokens=10, temperature=1.0, top_p=0.9, seed=8).result(timeout=60)
    for h in crowd:
        h.result(timeout=60)
    assert alone.token_ids == batched.token_ids
    assert other_seed.token_ids != alone.token_ids


def test_submit_before_start_and_after_stop_is_refused(registry: Registry) -> None:
    rt = Runtime(registry, max_batch_size=2, max_seq_len=64, max_prompt_tokens=32)
    with pytest.raises(RuntimeNotRunning):
        rt.submit([1, 2], max_new_tokens=2)
    rt.start(V1)
    with pytest.raises(InvalidRequest, match="already started"):
        rt.start(V1)
    pending = [rt.submit(prompt(30 + i, 4), max_new_tokens=6) for i in range(5)]
    rt.stop(drain=True)
    assert all(h.result(timeout=1).finish_reason == "length" for h in pending)  # drained, not dropped
    assert not rt.is_running
    with pytest.raises(RuntimeNotRunning):
        rt.submit([1, 2], max_new_tokens=2)
    rt.start()  # again, from the history's last good version
    try:
        again = rt.submit(prompt(30, 4), max_new_tokens=6).result(timeout=60)
        assert again.token_ids == pending[0].result().token_ids and again.model_version == V1
    finally:
        rt.stop(drain=False)
