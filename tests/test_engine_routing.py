"""SLA routing in the runtime: two replicas (fast int8, standard fp32) of the demo model,
requests classified by length or a user classifier, spill-over from measured step times,
the batch ladder, and the length breaker's states."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _demo_registry import GOOD, private_copy, shared_demo_registry
from infersight.engine import PathOverloaded, PathSpec, Registry, RouteQuery, RoutingSpec, Runtime
from infersight.engine.errors import DeployRefused, InvalidRequest
from infersight.engine.events import BreakerChanged, EngineEvent
from infersight.engine.routing import LengthBreaker
from infersight.engine.step_times import StepTimes

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


def test_the_batch_cap_is_the_smallest_rung_that_holds_the_sla_at_the_arrival_rate(runtime: Runtime) -> None:
    runtime.submit(SHORT, max_new_tokens=8).result(30)
    fast = runtime._state.fast
    assert fast is not None
    fast.step_times = StepTimes()  # steps measured steeply growing with the batch (8 tokens a request)
    fast.step_times.observe_service(0.02, 8)
    for batch, seconds in ((1, 0.002), (4, 0.003), (8, 0.020), (16, 0.060)):
        fast.step_times.observe_decode(batch, seconds)
    runtime.routing.adapt()
    assert runtime.routing.caps()["fast"] == 1  # few arrivals: 16 ms a request holds 50 ms
    for _ in range(64):  # a burst: ~thousands per second, more than 1 slot at 16 ms serves
        runtime.routing.decide(SHORT, 8, None)
    runtime.routing.adapt()
    assert runtime.routing.caps()["fast"] == 4  # 8 and 16 would break the SLA (160, 480 ms)


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
