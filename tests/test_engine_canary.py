"""Canaries in the real runtime: two replicas side by side, sticky users, isolation,
promotion, rollback that never moves a running request, and refused bad input."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace

import _engine_serving_support as support
import pytest
from _engine_serving_support import V1, V2, prompt
from infersight.engine.errors import CanaryRunning, InvalidCanaryWeight, NoCanary, VersionNotFound
from infersight.engine.events import RequestFinished, RequestStarted
from infersight.engine.registry import Registry
from infersight.engine.runtime import Runtime
from infersight.engine.runtime_canary import user_bucket
from infersight.engine.runtime_loop import _charge_others

Greedy = Callable[[str, list[int], int], list[int]]
tiny_checkpoints, registry, greedy, runtime = (
    support.tiny_checkpoints,
    support.registry,
    support.greedy,
    support.runtime,
)  # fixtures


def _users(weight: float, canary: bool, n: int) -> list[str]:
    picked = [f"user-{i}" for i in range(500) if (user_bucket(f"user-{i}", V2) < weight) == canary]
    return picked[:n]


def test_canary_serves_its_users_beside_stable_with_each_versions_own_outputs(
    runtime: Runtime, greedy: Greedy
) -> None:
    runtime.canary.start(V2, 0.3)
    assert runtime.serving_version == V1 and runtime.canary.status is not None
    to_canary, to_stable = _users(0.3, True, 3), _users(0.3, False, 3)
    handles = [
        (u, True, runtime.submit(prompt(i, 5), max_new_tokens=6, user=u)) for i, u in enumerate(to_canary)
    ]
    handles += [
        (u, False, runtime.submit(prompt(i, 5), max_new_tokens=6, user=u)) for i, u in enumerate(to_stable)
    ]
    for i, (_user, on_canary, handle) in enumerate(handles):
        done = handle.result(timeout=60)
        version = V2 if on_canary else V1
        assert done.model_version == version
        # batched beside the other version, every answer is that version's own greedy output
        assert done.token_ids == tuple(greedy(version, prompt(i % 3, 5), 6))
    # sticky: the same user keeps its version on every request
    again = runtime.submit(prompt(9, 4), max_new_tokens=2, user=to_canary[0]).result(timeout=60)
    assert again.model_version == V2


def test_raising_the_weight_keeps_every_canary_user_on_the_canary() -> None:
    users = [f"u{i}" for i in range(2000)]
    at_10 = {u for u in users if user_bucket(u, V2) < 0.1}
    at_50 = {u for u in users if user_bucket(u, V2) < 0.5}
    assert at_10 <= at_50
    assert 0.07 < len(at_10) / len(users) < 0.13 and 0.45 < len(at_50) / len(users) < 0.55


def test_rollback_finishes_running_canary_requests_on_the_canary(runtime: Runtime, greedy: Greedy) -> None:
    runtime.canary.start(V2, 1.0)
    handle = runtime.submit(prompt(3, 6), max_new_tokens=40, user="anyone")
    next(iter(handle))  # it is running on the canary
    runtime.canary.abort("test: relevance regressed")
    assert runtime.canary.status is None
    done = handle.result(timeout=60)
    assert done.model_version == V2 and done.token_ids == tuple(greedy(V2, prompt(3, 6), 40))
    after = runtime.submit(prompt(4, 5), max_new_tokens=3, user="anyone").result(timeout=60)
    assert after.model_version == V1
    last = runtime.history()[-1]
    assert (last.reason, last.outcome, last.message) == ("canary", "rolled_back", "test: relevance regressed")
    assert runtime.registry.history.last_good() == V1  # a rolled-back canary never became good


def test_promotion_makes_the_canary_serve_everyone(runtime: Runtime) -> None:
    runtime.canary.start(V2, 0.1)
    runtime.canary.set_weight(0.5)
    assert runtime.canary.status is not None and runtime.canary.status.weight == 0.5
    runtime.canary.promote("100%: no regression")
    assert runtime.serving_version == V2 and runtime.canary.status is None
    assert (
        runtime.submit(prompt(1, 4), max_new_tokens=2, user=_users(0.1, False, 1)[0])
        .result(timeout=60)
        .model_version
        == V2
    )
    assert runtime.registry.history.last_good() == V2
    assert [r.outcome for r in runtime.history()[-3:]] == ["started", "reweighted", "deployed"]


@pytest.mark.parametrize("weight", [0.0, -0.1, 1.5, float("nan")])
def test_canary_weight_outside_zero_one_is_refused(runtime: Runtime, weight: float) -> None:
    with pytest.raises(InvalidCanaryWeight, match="weight"):
        runtime.canary.start(V2, weight)
    assert runtime.canary.status is None and runtime.serving_version == V1


def test_second_canary_and_deploy_during_a_canary_are_refused(runtime: Runtime) -> None:
    runtime.canary.start(V2, 0.1)
    with pytest.raises(CanaryRunning, match=V2):
        runtime.canary.start(V2, 0.2)
    with pytest.raises(CanaryRunning):
        runtime.deploy(V2)
    status = runtime.canary.status
    assert status is not None and status.weight == 0.1 and runtime.serving_version == V1


def test_unknown_version_canary_and_no_canary_actions_are_refused(runtime: Runtime) -> None:
    with pytest.raises(Exception) as info:
        runtime.canary.start("mixtral_tiny_fp32-v9.9", 0.1)
    assert isinstance(info.value.__cause__, VersionNotFound)
    with pytest.raises(NoCanary):
        runtime.canary.promote()
    with pytest.raises(NoCanary):
        runtime.canary.abort()


def test_a_rollback_during_a_canary_rolls_the_canary_back(runtime: Runtime) -> None:
    runtime.canary.start(V2, 0.5)
    outcome = runtime.rollback()  # e.g. an alert rule's rollback action
    assert (outcome.from_version, outcome.to_version) == (V2, V1)
    assert runtime.canary.status is None and runtime.serving_version == V1
    assert runtime.history()[-1].outcome == "rolled_back"


def test_a_canary_survives_a_restart_with_its_weight_users_and_start_time(registry: Registry) -> None:
    first = Runtime(registry, max_batch_size=2, max_prompt_tokens=64, max_seq_len=96)
    first.start(V1)
    first.canary.start(V2, 0.1)
    first.canary.set_weight(0.5)
    began = first.canary.status
    assert began is not None
    user = _users(0.5, True, 1)[0]
    first.stop()  # a crash or a restart: nothing ended the canary
    again = Runtime(registry, max_batch_size=2, max_prompt_tokens=64, max_seq_len=96)
    again.start()  # the last good version: the stable one
    try:
        status = again.canary.status
        assert status is not None and (status.version, status.stable_version, status.weight) == (V2, V1, 0.5)
        assert status.started_at == began.started_at  # the same canary, not a new one
        assert again.submit(prompt(1, 4), max_new_tokens=2, user=user).result(timeout=60).model_version == V2
        assert [r.outcome for r in again.history() if r.reason == "canary"] == [
            "started",
            "reweighted",
            "resumed",
        ]
        again.canary.abort("done")
    finally:
        again.stop()
    third = Runtime(registry, max_batch_size=2, max_prompt_tokens=64, max_seq_len=96)
    third.start()
    try:
        assert third.canary.status is None  # rolled back before the restart: stays ended
    finally:
        third.stop()


def test_a_canary_is_not_resumed_beside_another_version(registry: Registry) -> None:
    first = Runtime(registry, max_batch_size=2, max_prompt_tokens=64, max_seq_len=96)
    first.start(V1)
    first.canary.start(V2, 0.2)
    first.stop()
    again = Runtime(registry, max_batch_size=2, max_prompt_tokens=64, max_seq_len=96)
    again.start(V2)  # an operator restarted on the candidate itself
    try:
        assert again.canary.status is None and again.serving_version == V2
        last = again.history()[-1]
        assert (last.reason, last.outcome, last.to_version) == ("canary", "rolled_back", V1)
        assert "not resumed after a restart" in last.message
    finally:
        again.stop()


def test_each_request_reports_the_time_it_waited_on_the_other_versions_forwards(runtime: Runtime) -> None:
    # What the runtime reports, not how long anything took: amounts are charged per step by
    # _charge_others (below, with given step times)
    recorder = support.Recorder()
    runtime.subscribe(recorder)
    alone = runtime.submit(prompt(1, 5), max_new_tokens=4).result(timeout=60)
    runtime.canary.start(V2, 0.5)
    queued = threading.Event()

    def hold(event: object) -> None:  # on the loop thread: the canary request cannot get ahead
        if isinstance(event, RequestStarted) and event.request_id == "on-canary":
            queued.wait(timeout=60)  # of the stable one, however busy the machine

    runtime.subscribe(hold)
    on_canary = runtime.submit(
        prompt(2, 5), max_new_tokens=12, user=_users(0.5, True, 1)[0], request_id="on-canary"
    )
    on_stable = runtime.submit(prompt(3, 5), max_new_tokens=4, user=_users(0.5, False, 1)[0])
    queued.set()  # the stable request joins while the canary one has most of its tokens to go
    stable, canary = on_stable.result(timeout=60), on_canary.result(timeout=60)
    assert (stable.model_version, canary.model_version) == (V1, V2)
    finished = {e.request_id: e for e in recorder.of(RequestFinished)}
    assert finished[alone.request_id].others_s == 0.0  # no other version ran
    for done in (stable, canary):  # each waited on the other's forwards, within its own life
        event = finished[done.request_id]
        assert event.others_s > 0.0
        assert event.others_s <= event.duration_s  # _finish clamps it to the request's life


def test_a_step_charges_each_running_request_with_the_other_versions_forwards() -> None:
    # each replica's busy_s is its own timing of its forwards; here given, not measured
    requests = [SimpleNamespace(others_s=0.0) for _ in range(4)]
    stable = SimpleNamespace(version=V1, busy_s=10.0, running={0: requests[0], 1: requests[1]})
    canary = SimpleNamespace(version=V2, busy_s=5.0, running={0: requests[2]})
    draining = SimpleNamespace(version="old", busy_s=1.0, running={0: requests[3]})  # no forward
    state = SimpleNamespace(draining=[draining], current=stable, canary=canary, fast=None, shadow=None)
    began = {id(r): r.busy_s for r in (stable, canary, draining)}
    stable.busy_s, canary.busy_s = 10.25, 5.125
    _charge_others(state, began)  # type: ignore[arg-type]
    began = {id(r): r.busy_s for r in (stable, canary, draining)}
    stable.busy_s = 10.5  # a step where only the stable version ran
    _charge_others(state, began)  # type: ignore[arg-type]
    assert [r.others_s for r in requests] == [0.125, 0.125, 0.25 + 0.25, 0.375 + 0.25]
