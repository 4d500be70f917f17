"""SLA routing in the runtime: two replicas (fast int8, standard fp32) of the demo model,
requests classified by length or a user classifier, spill-over from measured step times,
the batch ladder, and the length breaker's states."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _demo_registry import GOOD, private_copy, shared_demo_registry
from infersight.engine import PathSpec, Registry, RouteQuery, RoutingSpec, Runtime
from infersight.engine.errors import DeployRefused, InvalidRequest, PathOverloaded
from infersight.engine.events import BreakerChanged, EngineEvent
from infersight.engine.routing import LengthBreaker, RouteControl
from infersight.engine.runtime_loop import LoopState, PendingQueue
from infersight.engine.step_times import BATCH_LADDER, StepTimes, batch_cap

INT8 = "mixtral_banking_int8-v1.0"
SHORT = list(range(1000, 1012))  # 12 tokens
LONG = list(range(1000, 1200))  # 200 tokens


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return private_copy(shared_demo_registry(tmp_path_factory), tmp_path_factory.mktemp("route") / "registry")


def _runtime(registry: Path, **spec: object) -> Runtime:
    runtime = Runtime(Registry(registry), max_batch_size=16, max_prompt_tokens=512, max_seq_len=512)
    runtime.start(GOOD)
    fields: dict[str, object] = {
        "fast": PathSpec(INT8, 50.0, max_prompt_tokens=32, max_new_tokens=16),
        "standard": PathSpec(GOOD, 200.0),
    }
    fields.update(spec)
    runtime.routing.start(RoutingSpec(**fields))  # type: ignore[arg-type]
    return runtime


@pytest.fixture
def runtime(registry: Path) -> Iterator[Runtime]:
    rt = _runtime(registry)
    yield rt
    rt.stop(drain=False)


def test_short_requests_run_on_the_fast_version_and_long_ones_on_the_standard(runtime: Runtime) -> None:
    short = runtime.submit(SHORT, max_new_tokens=8)
    long = runtime.submit(LONG, max_new_tokens=8)
    wordy = runtime.submit(SHORT, max_new_tokens=64)  # asks for more output than the fast path takes
    assert (short.path, short.route_reason, short.result(30).model_version) == ("fast", "short", INT8)
    assert (long.path, long.route_reason, long.result(30).model_version) == ("standard", "long", GOOD)
    assert (wordy.path, wordy.result(30).model_version) == ("standard", GOOD)
    counts = runtime.routing.counts()
    assert counts[("fast", "short")] == 1 and counts[("standard", "long")] == 2


def test_each_replica_measures_its_decode_steps_by_batch_size(runtime: Runtime) -> None:
    handles = [runtime.submit(SHORT, max_new_tokens=8) for _ in range(6)]
    for h in handles:
        h.result(30)
    fast = runtime._state.fast
    assert fast is not None
    snap = fast.step_times.snapshot()
    assert snap.steps > 0 and snap.prefill_s_per_token is not None and snap.service_s is not None
    assert all(b >= 1 and s > 0 for b, s in snap.decode_s.items())
    predicted = runtime.routing.predict_s("fast", 12, 8)
    assert predicted is not None and 0 < predicted < 5.0
    assert runtime.routing.caps()["fast"] in (1, 4, 8, 16)


def test_a_raising_classifier_sends_the_request_standard_and_is_counted(registry: Path) -> None:
    seen: list[RouteQuery] = []

    def classify(query: RouteQuery) -> str:
        seen.append(query)
        if query.text == "boom":
            raise RuntimeError("the user's classifier has a bug")
        return "standard" if "complex" in (query.text or "") else "fast"

    rt = _runtime(registry, classifier=classify)
    try:
        broken = rt.submit(SHORT, max_new_tokens=4, text="boom")
        complex_ = rt.submit(SHORT, max_new_tokens=4, text="a complex question")
        simple = rt.submit(SHORT, max_new_tokens=4, text="where is my card")
        assert (broken.path, broken.route_reason) == ("standard", "classifier_error")
        assert (complex_.path, complex_.route_reason) == ("standard", "classifier")
        assert (simple.path, simple.route_reason) == ("fast", "classifier")
        assert broken.result(30).output_tokens == 4  # served, not failed
        assert rt.routing.counts()[("standard", "classifier_error")] == 1
        assert seen[0].max_new_tokens == 4 and list(seen[0].prompt_ids) == SHORT
    finally:
        rt.stop(drain=False)


def test_a_fast_path_measured_slow_spills_short_requests_to_the_standard_path(runtime: Runtime) -> None:
    for h in [runtime.submit(SHORT, max_new_tokens=8) for _ in range(2)] + [
        runtime.submit(LONG, max_new_tokens=8)
    ]:
        h.result(30)
    fast = runtime._state.fast
    assert fast is not None
    # the fast replica's steps measured at 50 ms (as on an overloaded device): 8 steps miss 50 ms
    for batch in (1, 2, 4, 8, 16):
        for _ in range(30):
            fast.step_times.observe_decode(batch, 0.05)
    spilled = runtime.submit(SHORT, max_new_tokens=8)
    assert (spilled.path, spilled.route_reason) == ("standard", "spill")
    assert spilled.result(30).model_version == GOOD
    runtime.routing.adapt()
    assert runtime.routing.caps()["fast"] == 16  # no rung holds 50 ms: the one serving the most per second


def _steps(*measured: tuple[int, float]) -> StepTimes:
    times = StepTimes()
    for batch, seconds in measured:
        times.observe_decode(batch, seconds)
    return times


def test_the_batch_cap_is_the_rung_of_most_requests_per_second_within_the_sla() -> None:
    # steps grow with the batch; 8 output tokens and a 1 ms prefill a request: a request in
    # a full batch of c takes c ms of prefills + 8 steps: 1: 17 ms, 4: 28, 8: 48, 16: 80
    times = _steps((1, 0.002), (4, 0.003), (8, 0.005), (16, 0.008))

    def cap(sla_s: float, beside_s: float = 0.0) -> int:
        return batch_cap(
            times, BATCH_LADDER, sla_s=sla_s, output_tokens=8, prefill_s=0.001, beside_s=beside_s
        )

    assert [cap(s) for s in (0.020, 0.030, 0.050, 0.200)] == [1, 4, 8, 16]  # grows as the SLA allows
    assert cap(0.010) == 16  # none holds: the most per second (16 / 80 ms against 8 / 48, 4 / 28)
    times.observe_decode(16, 0.028)  # the mean moves to 12 ms: 16 takes 112 ms, 16 / 112 < 8 / 48
    assert (cap(0.010), cap(0.200)) == (8, 8)
    assert cap(0.050, beside_s=0.002) == 4  # the other replica's 2 ms a step: 8 takes 64 ms
    assert batch_cap(StepTimes(), BATCH_LADDER, sla_s=0.05, output_tokens=8, prefill_s=0.0) == 16


def test_a_path_with_few_arrivals_gets_the_larger_cap_its_prefills_allow() -> None:
    times = _steps((1, 0.002), (4, 0.003), (8, 0.005), (16, 0.008))

    def cap(arrival_rate: float) -> int:
        return batch_cap(times, BATCH_LADDER, sla_s=0.050, output_tokens=8, prefill_s=0.005,
                         arrival_rate=arrival_rate)  # fmt: skip

    # saturated, a request in a full batch of 8 waits for 8 prefills of 5 ms: 40 + 8 x 5 = 80 ms;
    # at 2 a second hardly another one joins during its 45 ms
    assert (cap(math.inf), cap(100.0), cap(2.0)) == (4, 4, 8)


def test_a_rung_not_measured_yet_is_tried_and_given_up_once_measured_too_slow() -> None:
    times = _steps((1, 0.002))  # only single requests seen: a larger batch costs at least 2 ms

    def cap() -> int:
        return batch_cap(times, BATCH_LADDER, sla_s=0.050, output_tokens=8, prefill_s=0.001)

    assert cap() == 16  # optimistic: 16 ms of prefills + 8 x 2 ms holds 50 ms
    times.observe_decode(16, 0.012)  # the load filled it: measured 12 ms, 16 + 96 ms misses
    # between 1 and 16 the line: 8 -> 6.7 ms (61 ms, misses), 4 -> 4 ms (36 ms, holds)
    assert cap() == 4
    for _ in range(999):  # single requests again for a while: 16 was measured 999 steps ago
        times.observe_decode(1, 0.002)
    assert cap() == 4
    times.observe_decode(1, 0.002)  # 1000 steps ago: maybe a busy spell, it is tried again
    assert cap() == 16


def test_adapt_sets_each_paths_cap_from_its_own_measurements(runtime: Runtime) -> None:
    runtime.submit(SHORT, max_new_tokens=8).result(30)
    runtime.submit(LONG, max_new_tokens=8).result(30)
    fast, standard = runtime._state.fast, runtime._state.current
    assert fast is not None and standard is not None
    fast.step_times = _steps((1, 0.002), (4, 0.003), (8, 0.005), (16, 0.012))
    fast.step_times.observe_service(0.02, 8)
    fast.step_times.observe_prefill(12, 0.001)
    standard.step_times = _steps((1, 0.004), (16, 0.034))  # 2 + 2c ms a step
    standard.step_times.observe_service(0.1, 8)
    standard.step_times.observe_prefill(200, 0.008)
    runtime.routing.adapt()
    # one arrival each so far: no request joins a running one, a batch costs its own prefill
    # fast (50 ms): 8 takes 1 ms + 8 x 5 ms = 41 ms, 16: 97 ms; standard (200 ms): 8 takes
    # 8 ms + 8 x 18 ms = 152 ms, 16: 280 ms
    assert runtime.routing.caps() == {"fast": 8, "standard": 8}
    for _ in range(64):  # a burst of long requests: a full batch turns over in a request's life
        runtime.routing.decide(LONG, 8, None)
    runtime.routing.adapt()
    # standard: 8 x 8 ms prefills + 8 x 18 ms = 208 ms misses, 4 x 8 ms + 8 x 10 ms = 112 ms holds
    assert runtime.routing.caps() == {"fast": 8, "standard": 4}


def _request(arrival: float, made: int, budget: int) -> Any:
    return SimpleNamespace(arrival=arrival, tokens=[0] * made, max_new_tokens=budget)


def _replica(running: list[Any], times: StepTimes, cap: int = 16) -> Any:
    return SimpleNamespace(running=dict(enumerate(running)), step_times=times, cap=cap)


def test_the_standard_replica_sits_a_step_out_while_a_fast_deadline_is_at_risk() -> None:
    spec = RoutingSpec(PathSpec("fast-v", 50.0), PathSpec("standard-v", 200.0))
    state = LoopState(queue=PendingQueue())
    control = RouteControl(SimpleNamespace(_state=state))  # type: ignore[arg-type]
    control.spec = spec
    now = time.monotonic()
    # 6 tokens left at 3 ms a fast step: 18 ms alone; with the standard's 10 ms steps, 78 ms
    state.fast = _replica([_request(now - 0.020, 2, 8)], _steps((1, 0.003)))
    long = _request(now - 0.010, 4, 32)  # 28 steps of 13 ms: 364 ms, its 200 ms missed anyway
    state.current = _replica([long], _steps((1, 0.010)))
    assert control.hold() is state.current and control.held == 1
    long.tokens = [0] * 18  # 14 steps left: 182 ms, 190 ms to its deadline: 18 ms more misses it
    assert control.hold() is None
    long.tokens = [0] * 28  # 4 left: holding costs it nothing it needs
    assert control.hold() is state.current
    state.fast = _replica([_request(now - 0.045, 2, 8)], _steps((1, 0.003)))  # late even alone
    assert control.hold() is None
    state.fast = _replica([_request(now, 6, 8)], _steps((1, 0.003)))  # 2 left: 26 ms with both
    assert control.hold() is None


def test_routing_refuses_an_unknown_fast_version_and_non_positive_sla(registry: Path) -> None:
    rt = Runtime(Registry(registry), max_batch_size=4, max_prompt_tokens=256, max_seq_len=512)
    rt.start(GOOD)
    try:
        with pytest.raises(DeployRefused):
            rt.routing.start(RoutingSpec(PathSpec("mixtral_banking_int8-v9.9", 50.0), PathSpec(GOOD, 200.0)))
        with pytest.raises(InvalidRequest, match="sla_ms"):
            rt.routing.start(RoutingSpec(PathSpec(INT8, 0.0), PathSpec(GOOD, 200.0)))
        assert not rt.routing.active
        assert rt.submit(SHORT, max_new_tokens=2).path is None  # without routing nothing changes
    finally:
        rt.stop(drain=False)


def test_the_breaker_opens_over_the_sla_sheds_long_requests_and_recovers() -> None:
    now = [0.0]
    breaker = LengthBreaker("standard", 0.2, window=50, cooldown_s=2.0, probes=5, clock=lambda: now[0])
    for _ in range(10):
        assert breaker.observe(30, 0.05) is None  # short ones within the SLA
    changes = [breaker.observe(300, 0.9) for _ in range(10)]  # a flood of long ones, far over
    assert "open" in changes and breaker.state == "open"
    assert breaker.threshold == 30  # the longest length still served in time
    assert breaker.admits(30) and not breaker.admits(300)
    assert 1.0 <= breaker.retry_after_s() <= 2.0
    now[0] += 2.5
    assert breaker.tick() == "half_open" and breaker.admits(300)
    assert breaker.observe(300, 0.8) == "open"  # a probe over the SLA reopens it
    now[0] += 2.5
    assert breaker.tick() == "half_open"
    assert [breaker.observe(30, 0.05) for _ in range(5)][-1] == "closed"
    assert breaker.status().opened == 2 and breaker.threshold is None


def test_one_slow_request_does_not_open_the_breaker_a_second_one_does() -> None:
    breaker = LengthBreaker("fast", 0.1, window=50, cooldown_s=2.0, probes=5, clock=lambda: 0.0)
    for _ in range(25):
        assert breaker.observe(16, 0.03) is None
    # one outlier: the p99 is over the SLA, the breaker stays closed
    assert breaker.observe(16, 0.12) is None and breaker.state == "closed"
    assert breaker.p99_s() == pytest.approx(0.12)
    for _ in range(10):
        assert breaker.observe(16, 0.03) is None
    assert breaker.observe(16, 0.15) == "open"  # a second miss in the window opens it
    assert breaker.threshold == 15  # no length separates the misses: everything of 16 tokens is shed


def test_an_open_breaker_refuses_with_retry_after_and_emits_its_states(registry: Path) -> None:
    rt = _runtime(
        registry, standard=PathSpec(GOOD, 1.0), breaker_cooldown_s=60.0
    )  # 1 ms: every long one misses
    events: list[EngineEvent] = []
    rt.subscribe(events.append)
    try:
        for h in [rt.submit(LONG, max_new_tokens=2) for _ in range(20)]:
            h.result(60)
        with pytest.raises(PathOverloaded) as refused:
            rt.submit(LONG, max_new_tokens=2)
        assert refused.value.path == "standard" and refused.value.retry_after_s >= 1.0
        assert rt.submit(SHORT, max_new_tokens=2).path == "fast"  # short ones go on
        assert rt.routing.counts()[("standard", "shed")] == 1
        rt.submit(SHORT, max_new_tokens=1).result(30)  # the loop delivers posted events
        states = [e.state for e in events if isinstance(e, BreakerChanged)]
        assert states == ["open"]
    finally:
        rt.stop(drain=False)


def test_step_times_interpolate_between_measured_batch_sizes() -> None:
    times = StepTimes()
    assert times.decode_s(4) is None and times.prefill_s(10) is None
    times.observe_decode(1, 0.010)
    times.observe_decode(8, 0.024)
    assert times.decode_s(1) == pytest.approx(0.010)
    assert times.decode_s(4) == pytest.approx(0.010 + 3 * 0.002)
    assert times.decode_s(16) == pytest.approx(0.024 + 8 * 0.002)
    times.observe_prefill(100, 0.05)
    assert times.prefill_s(10) == pytest.approx(0.005)
