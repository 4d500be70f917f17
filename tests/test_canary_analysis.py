"""The canary's sequential analysis: always-valid tests that catch a real regression fast,
never roll back an equal canary, ignore client errors, and decide the same whatever the
polling period (the verdict is a function of the observations alone)."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from infersight.alerts.release.canary import CanaryAnalysis, CanaryController, CanaryPolicy, msprt_lambda


def _feed(analysis: CanaryAnalysis, rng: random.Random, n: int, *, canary_share: float = 0.1,
          canary_error: float = 0.01, stable_error: float = 0.01, canary_relevance: float = 0.6,
          canary_slow: float = 1.0) -> int:  # fmt: skip
    """n requests; returns the index of the request at which the verdict first said rollback (or -1)."""
    for i in range(n):
        canary = rng.random() < canary_share
        rate = canary_error if canary else stable_error
        error = "EngineCrashed" if rng.random() < rate else None
        latency = rng.lognormvariate(-1.0, 0.3) * (canary_slow if canary else 1.0)
        analysis.observe(canary, error_type=error, latency_s=latency, output_tokens=rng.randint(20, 40))
        analysis.observe_relevance(canary, rng.gauss(canary_relevance if canary else 0.6, 0.08))
        if analysis.verdict().action == "rollback":
            return i
    return -1


def test_mixture_ratio_grows_with_evidence_and_is_one_without_variance() -> None:
    assert msprt_lambda(0.0, 1e-3, 0.05) < 1.0  # no effect observed: evidence against a difference
    assert msprt_lambda(0.1, 1e-4, 0.05) > 1e6
    assert msprt_lambda(0.1, 0.0, 0.05) == 1.0


def test_relevance_drop_rolls_back_within_a_few_dozen_canary_requests() -> None:
    analysis = CanaryAnalysis(CanaryPolicy(steps=(0.1, 0.5, 1.0), requests_per_step=10_000))
    at = _feed(analysis, random.Random(1), 5000, canary_relevance=0.2)
    assert 0 <= at < 1000
    verdict = analysis.verdict()
    assert verdict.action == "rollback" and verdict.reason.startswith("regression on relevance: canary 0.")
    assert "always-valid p=" in verdict.reason


def test_server_errors_and_slow_canary_each_roll_back_but_client_errors_do_not() -> None:
    errors = CanaryAnalysis(CanaryPolicy(requests_per_step=10_000))
    assert _feed(errors, random.Random(2), 20_000, canary_error=0.2) >= 0
    assert "server_errors" in errors.verdict().reason
    slow = CanaryAnalysis(CanaryPolicy(requests_per_step=10_000))
    assert _feed(slow, random.Random(3), 20_000, canary_slow=2.0) >= 0
    assert "latency" in slow.verdict().reason
    client = CanaryAnalysis(CanaryPolicy(requests_per_step=10_000))
    for i in range(4000):
        client.observe(i % 10 == 0, error_type="client_error" if i % 10 == 0 else None, latency_s=0.3)
    assert client.checks()[0].canary_n == 0 and client.verdict().action == "continue"


def test_equal_canaries_are_not_rolled_back() -> None:
    rollbacks = 0
    for seed in range(20):
        analysis = CanaryAnalysis(CanaryPolicy(requests_per_step=100_000))
        rollbacks += _feed(analysis, random.Random(100 + seed), 4000, canary_share=0.3) >= 0
    assert rollbacks == 0


def test_verdict_does_not_depend_on_how_often_it_is_read() -> None:
    rng = random.Random(7)
    stream = [(rng.random() < 0.1, rng.gauss(0.5, 0.1)) for _ in range(3000)]
    first = []
    for every in (1, 37, 500):
        analysis = CanaryAnalysis(CanaryPolicy(requests_per_step=100_000))
        seen = None
        for i, (canary, rel) in enumerate(stream):
            analysis.observe_relevance(canary, rel - (0.15 if canary else 0.0))
            if i % every == 0 and seen is None and analysis.verdict().action == "rollback":
                seen = analysis.verdict().reason
        first.append(seen or analysis.verdict().reason)
    assert first[0] == first[1] == first[2] and first[0].startswith("regression on relevance")


def test_promotion_steps_after_enough_canary_requests_without_regression() -> None:
    analysis = CanaryAnalysis(CanaryPolicy(steps=(0.1, 0.5, 1.0), requests_per_step=50))
    rng = random.Random(4)
    while analysis.verdict().action == "continue":
        _feed(analysis, rng, 1)
    verdict = analysis.verdict()
    assert verdict.action == "promote" and verdict.weight == 0.5
    assert "50 canary requests at 10%" in verdict.reason and "server_errors: canary" in verdict.reason
    analysis.advance()
    assert analysis.verdict().action == "continue" and analysis.weight == 0.5


class _FakeControl:
    """Stands in for `Runtime.canary` (the real one is covered in test_engine_canary.py)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.done = threading.Event()

    class status:  # the shape of CanaryStatus the controller reads
        version = "m_d_fp32-v1.1"

    def set_weight(self, weight: float) -> None:
        self.calls.append(("weight", weight))

    def promote(self, message: str = "") -> None:
        self.calls.append(("promote", message))
        self.done.set()

    def abort(self, message: str = "") -> None:
        self.calls.append(("abort", message))
        self.done.set()


class _Finished:
    def __init__(self, version: str, duration: float, request_id: str = "", others: float | None = None) -> None:
        self.model_version, self.duration_s, self.output_tokens, self.finish_reason = (
            version,
            duration,
            30,
            "stop",
        )
        self.request_id = request_id
        if others is not None:  # the engine's own field; an event without it counts whole
            self.others_s = others


class _Started:
    def __init__(self, version: str, request_id: str) -> None:
        self.model_version, self.request_id = version, request_id


RequestFinished = type("RequestFinished", (_Finished,), {})
RequestStarted = type("RequestStarted", (_Started,), {})


def test_latency_compares_only_requests_that_ran_beside_the_other_arm() -> None:
    controller = CanaryController(_FakeControl(), CanaryPolicy(requests_per_step=10_000, latency_baseline=5))
    controller.begin("m_d_fp32-v1.1", "m_d_fp32-v1.0", 0.1)
    # alone (nothing of the other arm running): a slow canary here says nothing of the release
    for i in range(60):
        version = "m_d_fp32-v1.1" if i % 2 else "m_d_fp32-v1.0"
        controller.on_event(RequestStarted(version, f"alone-{i}"))
        controller.on_event(RequestFinished(version, 0.9 if i % 2 else 0.1, f"alone-{i}"))
    assert controller.analysis is not None
    latency = next(c for c in controller.analysis.checks() if c.name == "latency")
    assert latency.canary_n == latency.stable_n == 0 and controller.served == {True: 30, False: 30}
    # side by side: compared
    for i in range(10):
        controller.on_event(RequestStarted("m_d_fp32-v1.0", f"s-{i}"))
        controller.on_event(RequestStarted("m_d_fp32-v1.1", f"c-{i}"))
        controller.on_event(RequestFinished("m_d_fp32-v1.0", 0.1, f"s-{i}"))
        controller.on_event(RequestFinished("m_d_fp32-v1.1", 0.1, f"c-{i}"))
    latency = next(c for c in controller.analysis.checks() if c.name == "latency")
    assert (latency.canary_n, latency.stable_n) == (10, 10)


@pytest.mark.parametrize("latency", ["own", "whole", "own-unreported"])
def test_latency_own_compares_each_arm_net_of_the_other_arms_forwards(latency: str) -> None:
    # A faster canary (own forwards 0.1 s) beside a slower stable (0.3 s): every step runs both
    # arms in turn, so a canary request pays the stable's forwards nearly always and a stable
    # request the canary's only while one runs. Whole, the faster canary looks the slower.
    # An event without `others_s` (not the runtime's) counts whole in either mode.
    net = latency == "own"
    policy = CanaryPolicy(requests_per_step=10_000, latency_baseline=20, latency=latency.split("-")[0])
    control = _FakeControl()
    controller = CanaryController(control, policy)
    controller.begin("m_d_fp32-v1.1", "m_d_fp32-v1.0", 0.1)
    rng = random.Random(7)
    for i in range(300):
        if control.done.is_set():
            break
        stable_own, canary_own = rng.uniform(0.28, 0.32), rng.uniform(0.09, 0.11)
        stable_others, canary_others = rng.uniform(0.0, 0.1), rng.uniform(0.27, 0.33)
        controller.on_event(RequestStarted("m_d_fp32-v1.0", f"s-{i}"))
        controller.on_event(RequestStarted("m_d_fp32-v1.1", f"c-{i}"))
        controller.on_event(RequestFinished("m_d_fp32-v1.0", stable_own + stable_others, f"s-{i}",
                                            None if latency.endswith("unreported") else stable_others))  # fmt: skip
        controller.on_event(RequestFinished("m_d_fp32-v1.1", canary_own + canary_others, f"c-{i}",
                                            None if latency.endswith("unreported") else canary_others))  # fmt: skip
    if net:  # its own latency is a third of the stable's: never over the stable's p90
        assert controller.analysis is not None and not control.calls
        check = next(c for c in controller.analysis.checks() if c.name == "latency")
        assert (check.canary_n, check.stable_n) == (300, 300)
        assert check.canary == 0.0 and not check.regressed
    else:  # the faster canary rolled back on latency
        assert control.done.wait(10)
        assert control.calls[0][0] == "abort" and "latency" in control.calls[0][1]


@pytest.mark.parametrize("bad", [True, False])
def test_controller_rolls_back_a_bad_canary_and_steps_up_a_good_one(bad: bool) -> None:
    control = _FakeControl()
    decided: list[Any] = []
    controller = CanaryController(control, CanaryPolicy(requests_per_step=40), on_decision=decided.append)
    controller.begin("m_d_fp32-v1.1", "m_d_fp32-v1.0", 0.1)
    rng = random.Random(5)
    for _ in range(3000):
        if control.done.is_set():
            break
        canary = rng.random() < 0.1
        version = "m_d_fp32-v1.1" if canary else "m_d_fp32-v1.0"
        controller.on_event(RequestFinished(version, rng.uniform(0.2, 0.3)))
        controller.on_relevance(version, rng.gauss(0.2 if bad and canary else 0.6, 0.05))
        time.sleep(0.0005)
    assert control.done.wait(10)
    if bad:
        assert control.calls[0][0] == "abort" and "relevance" in control.calls[0][1]
        assert controller.share_served < 0.15
        assert decided[0].action == "rollback"
    else:
        assert [c[0] for c in control.calls] == ["weight", "promote"] and control.calls[0][1] == 0.5
        assert [d.weight for d in decided] == [0.5, 1.0]


def _answer(rng: random.Random, topic: int, dims: int = 16, spread: float = 0.3) -> list[float]:
    """A unit-norm 'answer embedding' near the axis of `topic`."""
    v = [rng.gauss(0.0, spread) for _ in range(dims)]
    v[topic] += 1.0
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v]


@pytest.mark.parametrize("drifted", [False, True])
def test_output_drift_compares_answers_with_the_stable_versions_own(drifted: bool) -> None:
    policy = CanaryPolicy(requests_per_step=10_000, drift_baseline=20)
    analysis = CanaryAnalysis(policy)
    rng = random.Random(7)
    for i in range(3000):
        canary = i % 10 == 0
        # stable answers about topics 0-2; a drifted canary answers about topics 3-5
        topic = rng.randrange(3) + (3 if canary and drifted else 0)
        analysis.observe_output(canary, _answer(rng, topic))
    check = next(c for c in analysis.checks() if c.name == "output_drift")
    assert check.canary_n == 300 and check.stable_n == 2700 - 20  # the baseline fixes the reference only
    if drifted:
        assert analysis.verdict().action == "rollback" and "output_drift" in analysis.verdict().reason
        assert check.canary is not None and check.stable is not None and check.canary < check.stable
    else:
        assert not check.regressed and analysis.verdict().action == "continue"


def test_a_canary_whose_few_outputs_all_have_one_length_is_not_rolled_back() -> None:
    # the real-runtime false rollback: max_tokens 8, the canary's 31 answers all 8 tokens
    # (no spread), the stable's averaging 7.6 with some shorter ones; the same release
    analysis = CanaryAnalysis(CanaryPolicy(requests_per_step=10_000))
    rng = random.Random(11)
    for i in range(289):
        canary = i % 9 == 0
        tokens = 8 if canary or rng.random() < 0.8 else rng.randint(2, 7)
        analysis.observe(canary, error_type=None, latency_s=None, output_tokens=tokens)
    check = next(c for c in analysis.checks() if c.name == "output_length")
    assert check.canary == 8.0 and check.stable is not None and check.stable < 7.8
    assert not check.regressed and analysis.verdict().action == "continue"


def test_a_step_is_left_only_when_each_arm_has_enough_requests_for_the_checks_to_decide() -> None:
    analysis = CanaryAnalysis(CanaryPolicy(steps=(0.5, 1.0), requests_per_step=30, min_requests=20))
    for i in range(30):  # the canary reaches its step's count while the stable arm has 12
        analysis.observe(True, error_type=None, latency_s=0.1, output_tokens=8)
        if i % 5 < 2:
            analysis.observe(False, error_type=None, latency_s=0.1, output_tokens=8)
    verdict = analysis.verdict()
    assert verdict.action == "continue" and "stable n=12" in verdict.reason, verdict.reason
    for _ in range(8):
        analysis.observe(False, error_type=None, latency_s=0.1, output_tokens=8)
    assert analysis.verdict().action == "promote"
    # once relevance is scored, it too needs enough per arm before a step is left
    for _ in range(25):
        analysis.observe_relevance(True, 0.6)
    analysis.observe_relevance(False, 0.6)
    held = analysis.verdict()
    assert held.action == "continue" and held.reason.startswith("holding at 50%: relevance"), held.reason


def test_a_paired_canary_is_promoted_only_after_enough_pairs_and_enough_scored_pairs() -> None:
    from infersight.alerts.release.paired_checks import PairOutcome, PairPolicy

    analysis = CanaryAnalysis(
        CanaryPolicy(steps=(0.1, 1.0), requests_per_step=30), pairs=PairPolicy(min_pairs=10)
    )
    for _ in range(30):
        analysis.observe(True, error_type=None, latency_s=0.1, output_tokens=8)
    for _ in range(4):
        analysis.observe_pair(PairOutcome("new", "old", 8, 8, "length", "length", 0.6, 0.6, 0.95))
    verdict = analysis.verdict()
    assert verdict.action == "continue" and "4 of 10 pairs so far" in verdict.reason
    for _ in range(6):  # enough pairs, but only 4 of them scored so far
        analysis.observe_pair(PairOutcome("new", "old", 8, 8, "length", "length"))
    assert "4 of 10 pairs scored" in analysis.verdict().reason
    for _ in range(6):
        analysis.observe_pair(PairOutcome("new", "old", 8, 8, "length", "length", 0.6, 0.6, 0.95))
    assert analysis.verdict().action == "promote"
