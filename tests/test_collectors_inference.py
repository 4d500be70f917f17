"""InferenceStats: Prometheus histograms and the sliding-window sketches behind them."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from infersight.collectors import DURATION_BUCKETS, InferenceStats, InvalidObservation
from infersight.collectors.errors import InvalidQuery, UnknownMetric, WindowTooLong
from infersight.monitor.records import InferenceRecord
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _exact(values: list[float], q: float) -> float:
    """The q-quantile at rank floor(q * (n - 1)), DDSketch's definition."""
    ordered = sorted(values)
    return ordered[math.floor(q * (len(ordered) - 1))]


def test_histogram_buckets_count_each_observation_once_with_le_semantics() -> None:
    registry = CollectorRegistry()
    stats = InferenceStats(registry, clock=Clock())
    series = stats.series("m", "v1")
    for d in (0.001, 0.0011, 0.5, 0.5, 700.0):  # on a bound, just above, twice, beyond the last
        series.enter()
        series.exit(stats.clock(), d)
    s = _samples(registry)
    base = (("model", "m"), ("model_version", "v1"))
    bucket = "gen_ai_server_request_duration_seconds_bucket"
    assert s[(bucket, tuple(sorted((*base, ("le", "0.001")))))] == 1
    assert s[(bucket, tuple(sorted((*base, ("le", "0.0025")))))] == 2
    assert s[(bucket, tuple(sorted((*base, ("le", "0.5")))))] == 4
    assert s[(bucket, tuple(sorted((*base, ("le", "600.0")))))] == 4
    assert s[(bucket, tuple(sorted((*base, ("le", "+Inf")))))] == 5
    assert s[("gen_ai_server_request_duration_seconds_count", base)] == 5
    assert s[("gen_ai_server_request_duration_seconds_sum", base)] == pytest.approx(701.0021)
    assert s[("gen_ai_server_requests_in_flight", base)] == 0


def test_bucket_boundaries_cover_a_cpu_toy_model_and_a_hopper_gpu() -> None:
    assert DURATION_BUCKETS[0] == 0.001 and DURATION_BUCKETS[-1] >= 60
    ratios = [b / a for a, b in itertools.pairwise(DURATION_BUCKETS) if 0.01 <= a < 60]
    assert max(ratios) <= 2.5  # histogram_quantile stays within a factor 2.5 between 10 ms and a minute


def test_quantile_agrees_with_exact_value_within_stated_relative_accuracy() -> None:
    rng = random.Random(7)
    clock = Clock()
    stats = InferenceStats(clock=clock, relative_accuracy=0.01)
    values = [rng.lognormvariate(-1.5, 1.2) for _ in range(5000)]
    series = stats.series("m", "v1")
    for v in values:
        clock.t += 0.01
        series.enter()
        series.exit(clock(), v, ttft=v / 10)
    for q in (0.5, 0.9, 0.99, 0.999):
        got = stats.quantile("request_duration", q, 300)
        exact = _exact(values, q)
        assert got is not None and abs(got - exact) <= stats.relative_accuracy * exact
    ttft = stats.quantile("ttft", 0.99, 300)
    assert ttft is not None and abs(ttft - _exact(values, 0.99) / 10) <= 0.01 * _exact(values, 0.99) / 10


def test_sliding_window_forgets_old_requests_and_merges_across_models() -> None:
    clock = Clock(0.0)
    stats = InferenceStats(clock=clock, window_s=600, interval_s=10)
    old = stats.series("m", "v1")
    for _ in range(10):
        old.enter()
        old.exit(clock(), 5.0)
    clock.t = 400.0
    new = stats.series("m", "v2")
    for _ in range(10):
        stats.add(model="m", model_version="v2", duration_s=0.1, error_type="Timeout")
    assert stats.count(300) == 10
    assert stats.count(600) == 20
    assert stats.count(300, errors_only=True) == 10
    assert stats.count(600, model_version="v1") == 10
    assert stats.quantile("request_duration", 0.5, 300) == pytest.approx(0.1, rel=0.01)
    assert stats.quantile("request_duration", 0.99, 600) == pytest.approx(5.0, rel=0.01)
    assert stats.quantile("tpot", 0.5, 300) is None  # no data in the window
    clock.t = 2000.0
    assert stats.count(600) == 0 and new.model_version == "v2"


def test_failed_requests_are_counted_by_error_type() -> None:
    registry = CollectorRegistry()
    stats = InferenceStats(registry, clock=Clock())
    for error in ("TimeoutError", "TimeoutError", "ValueError", None):
        stats.observe(
            InferenceRecord(
                request_id="r", model="m", model_version="v", started_at=1.0, duration_s=0.2, error_type=error
            )
        )
    s = _samples(registry)
    base = (("model", "m"), ("model_version", "v"))
    assert (
        s[("gen_ai_server_request_errors_total", tuple(sorted((*base, ("error_type", "TimeoutError")))))] == 2
    )
    assert (
        s[("gen_ai_server_request_errors_total", tuple(sorted((*base, ("error_type", "ValueError")))))] == 1
    )
    assert stats.count(60, errors_only=True) == 3


def test_token_usage_histogram_is_split_by_token_type() -> None:
    registry = CollectorRegistry()
    stats = InferenceStats(registry, clock=Clock())
    stats.add(model="m", model_version="v", duration_s=1.0, prompt_tokens=100, output_tokens=3)
    s = _samples(registry)
    base = (("model", "m"), ("model_version", "v"))
    inp = tuple(sorted((*base, ("gen_ai_token_type", "input"))))
    out = tuple(sorted((*base, ("gen_ai_token_type", "output"))))
    assert s[("gen_ai_server_token_usage_sum", inp)] == 100
    assert s[("gen_ai_server_token_usage_sum", out)] == 3
    assert s[("gen_ai_server_token_usage_bucket", tuple(sorted((*inp, ("le", "64.0")))))] == 0
    assert s[("gen_ai_server_token_usage_bucket", tuple(sorted((*inp, ("le", "128.0")))))] == 1


def test_in_flight_and_waiting_follow_enter_leave_and_queue_changes() -> None:
    stats = InferenceStats(clock=Clock())
    series = stats.series("m", "v")
    series.enter()
    series.enter()
    series.add_waiting(3)
    assert stats.in_flight() == 2 and stats.waiting() == 3
    series.exit(1000.0, 0.1)
    series.add_waiting(-5)
    assert stats.in_flight(model="m") == 1 and stats.waiting() == 0


def test_full_buffer_is_folded_by_the_caller_so_memory_stays_bounded() -> None:
    stats = InferenceStats(clock=Clock(), max_pending=64)
    series = stats.series("m", "v")
    for _ in range(200):
        series.enter()
        series.exit(1000.0, 0.01)
    assert len(series.finished) + len(series.timed) // 2 < 64
    assert series.histograms["request_duration"].count >= 192


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"duration_s": float("nan")}, "nan_duration"),
        ({"duration_s": -1.0}, "negative_duration"),
        ({"duration_s": float("inf")}, "infinite_duration"),
        ({"duration_s": "1"}, "invalid_number"),
        ({"duration_s": 1.0, "ttft_s": float("nan")}, "nan_duration"),
        ({"duration_s": 1.0, "prompt_tokens": -3}, "invalid_count"),
        ({"duration_s": 1.0, "error_type": ""}, "invalid_label"),
    ],
)
def test_bad_observation_is_refused_with_a_typed_error_naming_the_reason(kwargs: dict, reason: str) -> None:
    stats = InferenceStats(clock=Clock())
    with pytest.raises(InvalidObservation) as info:
        stats.add(model="m", model_version="v", **kwargs)
    assert info.value.reason == reason
    assert stats.count(60) == 0


def test_bad_queries_raise_typed_errors_listing_what_is_valid() -> None:
    stats = InferenceStats(clock=Clock(), window_s=600)
    with pytest.raises(UnknownMetric, match="request_duration, ttft, tpot, queue_time"):
        stats.quantile("latency", 0.9, 60)
    with pytest.raises(InvalidQuery):
        stats.quantile("ttft", 1.5, 60)
    with pytest.raises(WindowTooLong):
        stats.count(601)
    with pytest.raises(InvalidQuery):
        stats.count(0)


def test_series_are_exported_with_zeros_from_creation() -> None:
    registry = CollectorRegistry()
    stats = InferenceStats(registry, clock=Clock())
    stats.series("m", "v")
    s = _samples(registry)
    assert s[("gen_ai_server_request_duration_seconds_count", (("model", "m"), ("model_version", "v")))] == 0
    assert stats.labels() == [("m", "v")]


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(min_value=1e-4, max_value=1e3), min_size=1, max_size=300),
    q=st.floats(min_value=0.0, max_value=1.0),
)
def test_any_quantile_of_any_data_is_within_the_relative_accuracy(values: list[float], q: float) -> None:
    clock = Clock()
    stats = InferenceStats(clock=clock, relative_accuracy=0.02, interval_s=1.0, window_s=600)
    for i, v in enumerate(values):
        clock.t = 1000.0 + i % 50  # spread over many intervals, merged at query time
        stats.add(model="m", model_version="v", duration_s=v)
    got = stats.quantile("request_duration", q, 600)
    exact = _exact(values, q)
    assert got is not None and abs(got - exact) <= 0.02 * exact * (1 + 1e-9)


def test_client_chosen_label_values_past_the_cap_become_other_and_are_counted() -> None:
    registry = CollectorRegistry()
    stats = InferenceStats(registry, max_label_values=2)
    for model, version in (("x", "1"), ("y", "2"), ("x", "3"), ("x", "2"), ("x", "1")):
        stats.add(model=model, model_version=version, duration_s=0.1)
    # "3" is a third version (past 2 values); ("x", "2") a third combination of known values
    stats.series("x", "runtime-v9", trusted=True).add_waiting(0)  # a registered version: its own label
    stats.add(model="x", model_version="runtime-v9", duration_s=0.1)
    assert sorted(stats.labels()) == [("other", "other"), ("x", "1"), ("x", "runtime-v9"), ("y", "2")]
    assert stats.count(60, model_version="other") == 2 and stats.count(60) == 6
    counted = {
        s.labels["label"]: s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
        if s.name == "infersight_label_values_overflowed_total"
    }
    assert counted == {"model": 0, "model_version": 1, "series": 2}
