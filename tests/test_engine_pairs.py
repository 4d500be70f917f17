"""Paired answers in the real runtime: while a canary runs, or for a while after a deploy, a
share of live requests is also answered by the other version with the same prompt (or that
version's own, given per version), budget and seed; only the live answer reaches the client;
shadows never delay live requests (they are dropped, counted, when live requests wait) and
never show up as traffic."""

from __future__ import annotations

import time
from collections.abc import Callable

import _engine_serving_support as support
import pytest
from _engine_serving_support import V1, V2, VOCAB, Recorder, prompt
from infersight.engine.errors import InvalidRequest, PromptTooLong
from infersight.engine.events import (
    PairCompleted,
    RequestFailed,
    RequestFinished,
    RequestQueued,
    TokenEmitted,
)
from infersight.engine.runtime import Runtime
from infersight.engine.runtime_shadow import PAIR_SUFFIX

Greedy = Callable[[str, list[int], int], list[int]]
tiny_checkpoints, registry, greedy, runtime = (
    support.tiny_checkpoints,
    support.registry,
    support.greedy,
    support.runtime,
)  # fixtures


def _pairs(recorder: Recorder, n: int, timeout: float = 60.0) -> list[PairCompleted]:
    return support.completed_pairs(recorder, n, timeout)


def test_canary_pairs_hold_both_versions_answers_to_the_same_request(
    runtime: Runtime, greedy: Greedy
) -> None:
    recorder = Recorder()
    runtime.subscribe(recorder)
    runtime.shadow.configure(share=1.0)
    runtime.canary.start(V2, 0.5)
    handles, done = [], []
    for wave in range(3):  # two at a time: the live queue always has room for their shadows
        batch = [
            runtime.submit(prompt(i, 6), max_new_tokens=5, user=f"u{i}") for i in (2 * wave, 2 * wave + 1)
        ]
        handles += batch
        done += [h.result(timeout=60) for h in batch]
    pairs = {p.request_id: p for p in _pairs(recorder, 6)}
    assert set(pairs) == {h.request_id for h in handles}
    for i, completion in enumerate(done):
        pair = pairs[completion.request_id]
        other = V1 if completion.model_version == V2 else V2
        assert (pair.live_version, pair.other_version) == (completion.model_version, other)
        # the client got the live answer; the shadow is the other version's own answer
        assert (
            pair.live_tokens
            == completion.token_ids
            == tuple(greedy(completion.model_version, prompt(i, 6), 5))
        )
        assert pair.other_tokens == tuple(greedy(other, prompt(i, 6), 5))
        assert pair.prompt_ids == pair.other_prompt_ids == tuple(prompt(i, 6)) and pair.max_new_tokens == 5
        assert pair.live_finish == pair.other_finish == "length"
    # shadows are not traffic: no subscriber saw a request of theirs
    assert not [e for e in recorder.events if getattr(e, "request_id", "").endswith(PAIR_SUFFIX)]
    assert len(recorder.of(RequestFinished)) == 6 and len(recorder.of(RequestQueued)) == 6
    stats = runtime.shadow.stats()
    assert (stats.paired, stats.completed, stats.dropped, stats.waiting) == (6, 6, 0, 0)


def test_a_sampled_pair_shares_one_seed(runtime: Runtime) -> None:
    recorder = Recorder()
    runtime.subscribe(recorder)
    runtime.shadow.configure(share=1.0)
    runtime.canary.start(V2, 0.5)
    user = next(f"u{i}" for i in range(100) if not runtime.canary.route(f"u{i}", "x"))  # on V1
    live = runtime.submit(prompt(3, 6), max_new_tokens=6, temperature=0.9, user=user).result(timeout=60)
    (pair,) = _pairs(recorder, 1)
    assert pair.seed is not None and pair.live_tokens == live.token_ids and pair.other_version == V2
    runtime.canary.abort()
    # each side drew with that seed: V1 alone, seeded so, answers what the client got
    again = runtime.submit(prompt(3, 6), max_new_tokens=6, temperature=0.9, seed=pair.seed).result(timeout=60)
    assert again.token_ids == pair.live_tokens


def test_after_a_deploy_the_previous_version_answers_shadows_until_let_go(
    runtime: Runtime, greedy: Greedy
) -> None:
    recorder = Recorder()
    runtime.subscribe(recorder)
    runtime.shadow.configure(share=1.0, keep_previous_s=600.0)
    runtime.deploy(V2)
    live = runtime.submit(prompt(1, 5), max_new_tokens=4).result(timeout=60)
    (pair,) = _pairs(recorder, 1)
    assert (pair.live_version, pair.other_version) == (V2, V1) and live.model_version == V2
    assert pair.other_tokens == tuple(greedy(V1, prompt(1, 5), 4))
    # both versions' decode steps, timed in the same seconds at one batch size (here 1)
    assert pair.live_step_s is not None and pair.other_step_s is not None
    assert pair.live_step_s > 0.0 and pair.other_step_s > 0.0
    assert runtime.shadow.stats().kept_version == V1
    runtime.shadow.release()
    runtime.submit(prompt(2, 5), max_new_tokens=2).result(timeout=60)  # not paired: let go
    deadline = time.monotonic() + 30
    while runtime.shadow.stats().kept_version is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert runtime.shadow.stats().kept_version is None
    runtime.submit(prompt(3, 5), max_new_tokens=2).result(timeout=60)
    assert runtime.shadow.stats().paired == 1  # nothing to pair with once it is gone
    # a rollback never keeps the version it leaves
    runtime.shadow.configure(keep_previous_s=600.0)
    runtime.deploy(V1, reason="rollback")
    runtime.submit(prompt(4, 5), max_new_tokens=2).result(timeout=60)
    assert runtime.shadow.stats().paired == 1


def test_shadows_are_dropped_and_counted_when_live_requests_wait(runtime: Runtime) -> None:
    recorder = Recorder()
    runtime.subscribe(recorder)
    runtime.shadow.configure(share=1.0)
    runtime.canary.start(V2, 0.5)
    # 4 slots per replica, 20 live requests at once: most arrive with a batch of them waiting
    handles = [runtime.submit(prompt(i, 6), max_new_tokens=8, user=f"u{i}") for i in range(20)]
    for h in handles:
        assert len(h.result(timeout=60).token_ids) == 8  # every live answer whole
    stats = runtime.shadow.stats()
    assert stats.dropped > 0 and stats.paired + stats.dropped == 20
    _pairs(recorder, stats.paired)  # those taken all completed
    # and every live token went out: no live request was cancelled to make room
    assert len(recorder.of(TokenEmitted)) == 20 * 8


def test_a_hung_up_live_request_takes_its_shadow_with_it(runtime: Runtime) -> None:
    recorder = Recorder()
    runtime.subscribe(recorder)
    runtime.shadow.configure(share=1.0)
    runtime.canary.start(V2, 0.5)
    handle = runtime.submit(prompt(5, 6), max_new_tokens=40, user="u5")
    handle.cancel()
    assert handle.result(timeout=60).finish_reason == "cancelled"
    runtime.submit(prompt(6, 6), max_new_tokens=2, user="u6").result(timeout=60)
    _pairs(recorder, 1)  # the second request's pair arrives; the first never does
    deadline = time.monotonic() + 30
    while runtime.shadow.stats().waiting and time.monotonic() < deadline:
        time.sleep(0.02)
    stats = runtime.shadow.stats()
    assert (stats.completed, stats.discarded, stats.waiting) == (1, 1, 0)
    assert [p.request_id for p in recorder.of(PairCompleted)] != [handle.request_id]


def _user_on(runtime: Runtime, canary: bool) -> str:
    return next(u for u in (f"u{i}" for i in range(100)) if runtime.canary.route(u, "x") == canary)


def test_each_version_answers_its_own_prompt_live_and_as_shadow(runtime: Runtime, greedy: Greedy) -> None:
    recorder = Recorder()
    runtime.subscribe(recorder)
    runtime.shadow.configure(share=1.0)
    runtime.canary.start(V2, 0.5)
    assert set(runtime.chat_formats) == {V1, V2}  # both may answer a chat: both render it
    prompts = {V1: prompt(7, 6), V2: prompt(8, 9)}  # one chat, as each version's template renders it
    done = [
        runtime.submit(prompts[V1], max_new_tokens=4, user=_user_on(runtime, canary), prompts_by_version=prompts)
        .result(timeout=60)
        for canary in (False, True)
    ]  # fmt: skip
    assert [c.model_version for c in done] == [V1, V2]
    pairs = {p.request_id: p for p in _pairs(recorder, 2)}
    for completion in done:
        live = completion.model_version
        other = V1 if live == V2 else V2
        assert completion.token_ids == tuple(greedy(live, prompts[live], 4))  # its own rendering
        (queued,) = recorder.of(RequestQueued, completion.request_id)
        assert queued.prompt_tokens == len(prompts[live])
        pair = pairs[completion.request_id]
        assert pair.prompt_ids == tuple(prompts[live]) and pair.other_prompt_ids == tuple(prompts[other])
        assert pair.other_tokens == tuple(greedy(other, prompts[other], 4))


def test_a_prompt_too_long_for_its_version_is_refused_live_and_not_asked_of_a_shadow(
    runtime: Runtime,
) -> None:
    recorder = Recorder()
    runtime.subscribe(recorder)
    runtime.shadow.configure(share=1.0)
    runtime.canary.start(V2, 0.5)
    short, long = prompt(1, 6), prompt(2, 40)  # max_prompt_tokens is 32
    with pytest.raises(PromptTooLong):
        runtime.submit(short, max_new_tokens=4, user=_user_on(runtime, True), prompts_by_version={V2: long})
    with pytest.raises(InvalidRequest):  # out of the vocabulary: checked as prompt_ids is
        runtime.submit(
            short, max_new_tokens=4, user=_user_on(runtime, True), prompts_by_version={V2: [VOCAB]}
        )
    assert runtime.shadow.stats().paired == 0
    # served on V1 with its own prompt; its shadow on V2 would not fit: dropped, counted
    served = runtime.submit(
        short, max_new_tokens=4, user=_user_on(runtime, False), prompts_by_version={V2: long}
    )
    assert served.result(timeout=60).model_version == V1
    stats = runtime.shadow.stats()
    assert (stats.paired, stats.dropped) == (0, 1)
    failed = [e for e in recorder.of(RequestFailed) if e.error_type in ("PromptTooLong", "InvalidRequest")]
    assert [e.model_version for e in failed] == [V2, V2]
