"""Signal adapters: LiveSignals over the real collectors (InferenceStats' sliding-window
sketches, GPUCollector on the fake pynvml boundary, ProcessCollector), StoreSignals over
the shared `requests` table and the outbox, and a default rule firing from live data."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from infersight.alerts import Evaluator, LiveSignals, StoreSignals, load_config
from infersight.alerts.rules.signals import Signal, least_squares_slope
from infersight.collectors import GPUCollector, InferenceStats, ProcessCollector
from infersight.collectors.fake_nvml import FakeDevice, FakeNVML
from infersight.monitor.records import SHED, InferenceRecord, is_server_error
from infersight.monitor.store.tables import requests
from sqlalchemy import Engine, insert
from test_alerts_support import Clock, database

P99 = Signal("latency_quantile", metric="request_duration", quantile=0.99, window_s=60)
ERRORS = Signal("error_rate", window_s=60, min_requests=10)


@pytest.fixture
def sqlite_db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    with database("sqlite", tmp_path, request) as engine:
        yield engine


def _stats() -> InferenceStats:
    stats = InferenceStats(window_s=600, interval_s=1)
    now = time.time()
    for i in range(200):  # v1: 1..200 ms (1% fail); v2: 10x slower, 20% fail
        for version, scale, every in (("v1", 1, 100), ("v2", 10, 5)):
            stats.observe(
                InferenceRecord(
                    request_id=f"{version}-{i}",
                    model="bank",
                    model_version=version,
                    started_at=now,
                    duration_s=(i + 1) * 0.001 * scale,
                    error_type="Boom" if i % every == 0 else None,
                )
            )
    return stats


def test_latency_quantile_and_error_rate_per_version_from_the_real_sketches() -> None:
    stats = _stats()
    live = LiveSignals(stats)
    p99 = {dict(s.labels)["model_version"]: s.value for s in live.read(P99, ["model", "model_version"])}
    assert p99["v1"] == pytest.approx(0.199, rel=0.03) and p99["v2"] == pytest.approx(1.99, rel=0.03)
    errors = {dict(s.labels)["model_version"]: s.value for s in live.read(ERRORS, ["model_version"])}
    assert errors == {"v1": pytest.approx(0.01), "v2": pytest.approx(0.2)}
    [merged] = live.read(P99, [])
    assert merged.labels == () and 0.199 < merged.value < 2.0
    assert live.read(Signal("error_rate", window_s=60, min_requests=1000), ["model_version"]) == []


def test_requests_the_length_breaker_shed_are_counted_apart_not_as_server_errors() -> None:
    """A flood the breaker sheds (503) must not also page as an error-rate spike."""
    stats = InferenceStats(window_s=600, interval_s=1)
    now = time.time()
    for i in range(100):  # 40 shed, 2 real failures, the rest served
        error = SHED if i < 40 else "GenerationFailed" if i < 42 else None
        stats.observe(InferenceRecord(request_id=f"r-{i}", model="bank", model_version="v1",
                                      started_at=now, duration_s=0.01, error_type=error))  # fmt: skip
    [rate] = LiveSignals(stats).read(ERRORS, ["model_version"])
    assert rate.value == pytest.approx(0.02)
    assert stats.client_outcome_counts() == {SHED: 40}
    # one vocabulary (monitor/outcomes.py): the engine's class name is the same refusal as its label
    assert (
        not is_server_error(SHED)
        and not is_server_error("PathOverloaded")
        and is_server_error("GenerationFailed")
    )
    # ... but a shed request spends its SLO's budget, latency or availability
    from infersight.alerts.rules.slo import SLO

    fast = SLO("fast-latency", 0.999, 86400.0, threshold_s=0.1, path="fast")
    availability = SLO("availability", 0.995, 86400.0)
    assert fast.is_bad(0.001, SHED) and availability.is_bad(0.001, SHED)
    assert not fast.is_bad(0.05, None) and not availability.is_bad(0.05, "client_error")


def test_gpu_activity_memory_and_slope_from_the_fake_nvml_boundary() -> None:
    device = FakeDevice(sm_activity_pct=41.5, memory_used=10 << 30, memory_total=80 << 30)
    clock = Clock(0.0)
    gpu = GPUCollector(nvml=FakeNVML([device]), clock=clock)
    live = LiveSignals(gpu=gpu, clock=clock)
    for _ in range(6):  # 100 MB more every minute
        gpu.sample_once()
        live.read(Signal("memory_slope", resource="gpu", window_s=600), ["gpu"])
        device.memory_used += 100_000_000
        clock.advance(60)
    gpu.sample_once()
    [slope] = live.read(Signal("memory_slope", resource="gpu", window_s=600), ["gpu", "uuid"])
    assert slope.value == pytest.approx(1e8) and dict(slope.labels) == {"gpu": "0", "uuid": device.uuid}
    [activity] = live.read(Signal("gpu_sm_activity"), ["gpu"])
    assert activity.value == pytest.approx(0.415)
    [ratio] = live.read(Signal("gpu_memory_ratio"), [])
    assert ratio.value == pytest.approx(device.memory_used / (80 << 30))


def test_process_rss_slope() -> None:
    rss = [500 << 20]
    fake = SimpleNamespace(
        cpu_times=lambda: SimpleNamespace(user=1.0, system=0.5),
        memory_info=lambda: SimpleNamespace(rss=rss[0]),
        num_threads=lambda: 4,
        oneshot=lambda: __import__("contextlib").nullcontext(),
    )
    collector, clock = ProcessCollector(pid=4242, process=fake), Clock(0.0)
    live = LiveSignals(process=collector, clock=clock)
    for _ in range(5):
        collector.sample_once()
        live.read(Signal("memory_slope", resource="process", window_s=600), ["pid"])
        rss[0] += 50 << 20
        clock.advance(30)
    collector.sample_once()
    [slope] = live.read(Signal("memory_slope", resource="process", window_s=600), ["pid"])
    assert dict(slope.labels) == {"pid": "4242"} and slope.value == pytest.approx(100 << 20)


def test_least_squares_slope_is_exact_on_a_line() -> None:
    assert least_squares_slope([(t, 3 * t + 1) for t in range(10)]) == pytest.approx(3)
    assert least_squares_slope([(1, 5)]) is None


def test_default_latency_rule_fires_from_live_inference_stats(sqlite_db: Engine) -> None:
    stats = _stats()
    ev = Evaluator(sqlite_db, load_config(env={}), LiveSignals(stats), clock=Clock(time.time()))
    ev.evaluate()
    ev.clock.advance(121)  # type: ignore[attr-defined]
    fired = [t for t in ev.evaluate().transitions if t.to_state == "firing"]
    # v2's p99 is ~2 s: over the 1 s warning and (just) under or over 2 s critical, depending on the sketch
    assert {(t.alertname, dict(t.labels)["model_version"]) for t in fired} >= {("TailLatencyOverSLA", "v2")}
    assert all(dict(t.labels)["model_version"] == "v2" for t in fired)


def test_store_signals_compute_exact_figures_from_the_requests_table(sqlite_db: Engine) -> None:
    clock = Clock()
    with sqlite_db.begin() as conn:
        conn.execute(
            insert(requests),
            [
                {
                    "request_id": f"r{i}",
                    "model": "bank",
                    "model_version": "v1",
                    "source": "sdk",
                    "started_at": clock.now - dt.timedelta(seconds=i),
                    "duration_s": float(i + 1),
                    "error_type": "Boom" if i < 10 else None,
                    "relevance": 0.5,
                }
                for i in range(100)
            ],
        )
    store = StoreSignals(sqlite_db, clock=clock)
    [p99] = store.read(
        Signal("latency_quantile", metric="request_duration", quantile=0.99, window_s=1000), ["model_version"]
    )
    assert p99.value == pytest.approx(99.01)
    [rate] = store.read(Signal("error_rate", window_s=1000, min_requests=10), [])
    assert rate.value == pytest.approx(0.1)
    [recent] = store.read(Signal("error_rate", window_s=5), [])  # only the last 5 s: all errors
    assert recent.value == 1.0
    [relevance] = store.read(Signal("relevance"), ["model", "model_version"])
    assert relevance.value == pytest.approx(0.5)
    assert store.read(Signal("dead_letters"), []) == [store.read(Signal("dead_letters"), [])[0]]
    assert store.read(Signal("dead_letters"), [])[0].value == 0.0


def test_store_error_rate_counts_server_errors_not_what_the_clients_caused(sqlite_db: Engine) -> None:
    clock = Clock()
    kinds = ["client_error"] * 30 + ["cancelled"] * 30 + ["GenerationFailed"] * 4 + [None] * 36
    with sqlite_db.begin() as conn:
        conn.execute(
            insert(requests),
            [
                {
                    "request_id": f"r{i}",
                    "model": "bank",
                    "model_version": "v1",
                    "source": "engine",
                    "started_at": clock.now - dt.timedelta(seconds=1),
                    "duration_s": 0.1,
                    "error_type": kind,
                }
                for i, kind in enumerate(kinds)
            ],
        )
    [rate] = StoreSignals(sqlite_db, clock=clock).read(Signal("error_rate", window_s=60, min_requests=10), [])
    assert rate.value == pytest.approx(0.04)


def test_live_error_rate_counts_server_errors_not_what_the_clients_caused() -> None:
    stats = InferenceStats()
    for kind in ["client_error"] * 30 + ["cancelled"] * 30 + ["Boom"] * 4 + [None] * 36:
        stats.add(model="bank", model_version="v1", duration_s=0.1, error_type=kind)
    [rate] = LiveSignals(stats).read(Signal("error_rate", window_s=60, min_requests=10), [])
    assert rate.value == pytest.approx(0.04)


def test_store_relevance_is_the_mean_of_scored_rows_only_weighted_across_versions(sqlite_db: Engine) -> None:
    clock = Clock()

    def row(i: int, version: str, relevance: float | None, age_s: float = 1.0) -> dict[str, object]:
        return {
            "request_id": f"{version}-{i}",
            "model": "bank",
            "model_version": version,
            "source": "sdk",
            "started_at": clock.now - dt.timedelta(seconds=age_s),
            "duration_s": 0.1,
            "relevance": relevance,
        }

    with sqlite_db.begin() as conn:
        rows = [row(i, "v1", 0.8) for i in range(3)] + [row(i, "v2", 0.2) for i in range(1)]
        rows += [row(100 + i, "v1", None) for i in range(50)]  # not scored: not part of the mean
        rows += [row(200, "v2", 0.9, age_s=3600)]  # outside the 15-minute window
        conn.execute(insert(requests), rows)
    store = StoreSignals(sqlite_db, clock=clock)
    per_version = store.read(Signal("relevance"), ["model", "model_version"])
    assert [(dict(s.labels)["model_version"], s.value) for s in per_version] == [
        ("v1", pytest.approx(0.8)),
        ("v2", pytest.approx(0.2)),
    ]
    [per_model] = store.read(Signal("relevance"), ["model"])
    assert per_model.value == pytest.approx((3 * 0.8 + 0.2) / 4)
    with sqlite_db.connect() as conn:  # the window is read from the partial index, not the table
        plan = " ".join(
            str(r[-1])
            for r in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN SELECT model, model_version, sum(relevance), count(relevance) FROM requests "
                "WHERE started_at >= ? AND relevance IS NOT NULL GROUP BY model, model_version",
                ("2026-01-01",),
            )
        )
    assert "COVERING INDEX ix_requests_relevance_time" in plan, plan
