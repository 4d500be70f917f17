"""The checklist's step-time and load checks read the right signals: with the embedded
engine, its own decode step time at like batch sizes (sampled by the service, since the
engine keeps only a current estimate), TPOT for a proxy or OTLP source; and the process's
CPU busy beside GPU busy and queue time in the load check."""

from __future__ import annotations

import datetime as dt
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from _demo_registry import GOOD, private_copy, shared_demo_registry
from _service_support import auth, config, wait_for
from fastapi.testclient import TestClient
from infersight.collectors import ProcessCollector
from infersight.engine.step_times import StepTimes
from infersight.monitor.business import diagnose
from infersight.monitor.service import EngineConfig, create_app
from infersight.monitor.service.metrics import timeseries_point
from infersight.monitor.service.wiring_business import BusinessWiring, StepTimeHistory
from infersight.monitor.store import connect, sqlite_url, upgrade
from infersight.monitor.store.tables import requests
from sqlalchemy import Engine, insert

T0 = 1_800_000_000.0
DAY = 86_400.0


def _at(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, dt.UTC)


def _store(tmp_path: Path) -> Engine:
    db = connect(sqlite_url(tmp_path))
    upgrade(db)
    return db


def _traffic(
    db: Engine, start: float, *, n: int, span_s: float, tag: str, load: list[int] | None = None
) -> None:
    """`n` like requests over `span_s` seconds, decoding alike (the same TPOT) on both days.
    `load`: requests in each minute instead (the p99 grows with the minute's rate)."""
    rows = []
    times = (
        [start + i * span_s / n for i in range(n)]
        if load is None
        else [start + 60 * m + 60 * j / k for m, k in enumerate(load) for j in range(k)]
    )
    for i, t in enumerate(times):
        minute = int((t - start) // 60)
        busy = 1.0 if load is None else load[minute] / 10
        rows.append({
            "request_id": f"{tag}-{i}", "model": "m", "model_version": "v1", "source": "engine",
            "started_at": _at(t), "duration_s": 1.0 * busy, "ttft_s": 0.2, "tpot_s": 0.005,
            "queue_s": 0.01 * busy, "prompt_tokens": 150 + i % 100, "output_tokens": 200,
        })  # fmt: skip
    with db.begin() as conn:
        conn.execute(insert(requests), rows)


class Runtime:
    """The runtime's `step_times()` seam: version -> its replica's measured StepTimes."""

    def __init__(self) -> None:
        self.replicas: dict[str, StepTimes] = {"v1": StepTimes()}

    def step_times(self) -> dict[str, StepTimes]:
        return self.replicas


@contextmanager
def _nothing() -> Any:
    yield


def _serve(
    history: StepTimeHistory, times: StepTimes, start: float, steps_by_batch: dict[int, float]
) -> None:
    """Ten minutes of serving: each 30 s tick the engine runs steps of each batch size at
    the given seconds, then the service samples."""
    for tick in range(20):
        for batch, seconds in steps_by_batch.items():
            for _ in range(5):
                times.observe_decode(batch, seconds)
        history.sample(start + 30 * tick)


def test_a_slower_decode_step_at_like_batch_sizes_is_found_for_an_engine_source_and_tpot_for_a_proxy(
    tmp_path: Path,
) -> None:
    db = _store(tmp_path)
    _traffic(db, T0 - DAY - 600, n=600, span_s=600, tag="yesterday")
    _traffic(db, T0 - 600, n=600, span_s=600, tag="today")  # the same TPOT: it cannot see the kernels
    runtime = Runtime()
    history = StepTimeHistory(runtime.step_times, tick_s=30.0)
    _serve(history, runtime.replicas["v1"], T0 - DAY - 600, {4: 0.010, 8: 0.014})
    runtime.replicas["v1"] = StepTimes()  # restarted since: the engine's estimate begins again
    _serve(history, runtime.replicas["v1"], T0 - 600, {4: 0.015, 8: 0.021, 16: 0.040})
    business = BusinessWiring(
        db, clock=lambda: T0, feedback_ttl_s=DAY, long_prompt_tokens=2048, steps=history
    )
    found = business.diagnose("ThroughputDrop", {"model_version": "v1"}, _at(T0))
    kernel = next(c for c in found["checks"] if c["name"] == "kernel/step time")
    assert kernel["verdict"] == "suspect" and kernel["detail"]["source"] == "engine", kernel
    assert kernel["figure"].startswith(
        "engine decode step 1.50x at like batch sizes (batch 4: 10.0 -> 15.0 ms"
    )
    assert set(kernel["detail"]["decode_step_s"]) == {"4", "8"}  # batch 16 ran only today: not compared
    assert found["checks"][0]["name"] == "kernel/step time"  # nothing else changed

    proxy = diagnose(db, now=_at(T0), model_version="v1")  # no step samples: a proxy or OTLP source
    kernel = next(c for c in proxy.checks if c.name == "kernel/step time")
    assert kernel.verdict == "clear" and kernel.detail["source"] == "tpot"
    assert kernel.figure == "TPOT 5.0 -> 5.0 ms (1.00x) at like prompt length"


def test_larger_batches_stepping_slower_are_not_slower_kernels(tmp_path: Path) -> None:
    db = _store(tmp_path)
    _traffic(db, T0 - DAY - 600, n=600, span_s=600, tag="yesterday")
    _traffic(db, T0 - 600, n=600, span_s=600, tag="today")
    runtime = Runtime()
    history = StepTimeHistory(runtime.step_times, tick_s=30.0)
    _serve(history, runtime.replicas["v1"], T0 - DAY - 600, {1: 0.006, 4: 0.010})
    _serve(history, runtime.replicas["v1"], T0 - 600, {4: 0.010, 16: 0.040})  # busier: larger batches
    found = diagnose(db, now=_at(T0), model_version="v1", step_samples=history.samples())
    kernel = next(c for c in found.checks if c.name == "kernel/step time")
    assert kernel.verdict == "clear" and kernel.figure.startswith(
        "engine decode step 1.00x at like batch sizes"
    )
    assert set(kernel.detail["decode_step_s"]) == {"4"}
    other = diagnose(db, now=_at(T0), model_version="v2", step_samples=history.samples())  # another version's
    kernel = next(c for c in other.checks if c.name == "kernel/step time")
    assert kernel.verdict == "unknown" and kernel.figure.endswith(
        "(no engine decode steps at like batch sizes in both windows)"
    )


def test_the_step_history_records_the_sizes_stepped_since_the_tick_before_and_forgets_old_ticks() -> None:
    runtime = Runtime()
    times = runtime.replicas["v1"]
    history = StepTimeHistory(runtime.step_times, tick_s=5.0, keep_s=60.0)
    times.observe_decode(4, 0.01)
    history.sample(T0)
    times.observe_decode(8, 0.02)
    history.sample(T0 + 5)
    history.sample(T0 + 10)  # idle: nothing stepped, nothing recorded
    assert [(s.at, dict(s.decode_s)) for s in history.samples()] == [(T0, {4: 0.01}), (T0 + 5, {8: 0.02})]
    runtime.replicas["v1"] = StepTimes()  # a redeploy: a new replica whose steps count from 0
    runtime.replicas["v1"].observe_decode(1, 0.005)
    history.sample(T0 + 61)
    assert [(s.at, dict(s.decode_s)) for s in history.samples()] == [
        (T0 + 5, {8: 0.02}),
        (T0 + 61, {1: 0.005}),
    ]


class _Cpu:
    def __init__(self) -> None:
        self.user, self.system = 0.0, 0.0


class _Memory:
    rss = 100 << 20


class FakeProcess:
    """A psutil.Process-like seam: CPU time that grows at `busy` seconds per second."""

    def __init__(self, clock: list[float], busy: float) -> None:
        self.clock, self.busy = clock, busy

    def oneshot(self) -> Any:
        return _nothing()

    def cpu_times(self) -> _Cpu:
        cpu = _Cpu()
        cpu.user = self.clock[0] * self.busy
        return cpu

    def memory_info(self) -> _Memory:
        return _Memory()

    def num_threads(self) -> int:
        return 4


def test_process_cpu_busy_is_sampled_into_the_timeseries() -> None:
    t = [1000.0]
    collector = ProcessCollector(clock=lambda: t[0], process=FakeProcess(t, busy=1.5))
    assert collector.cpu_busy(60.0) is None  # nothing sampled yet
    for _ in range(12):
        collector.sample_once()
        t[0] += 5.0
    assert abs((collector.cpu_busy(60.0) or 0.0) - 1.5) < 1e-9  # one and a half cores
    point = timeseries_point(None, None, collector, window_s=60.0, tick_s=5.0)
    assert abs((point["process_cpu_seconds_per_s"] or 0.0) - 1.5) < 1e-9


def test_the_load_check_reports_cpu_busy_correlation_with_p99(tmp_path: Path) -> None:
    db = _store(tmp_path)
    load = [5, 8, 12, 6, 10, 14, 7, 9, 11, 13]  # requests in each minute; the p99 follows them
    _traffic(db, T0 - DAY - 600, n=0, span_s=600, tag="yesterday", load=load)
    _traffic(db, T0 - 600, n=0, span_s=600, tag="today", load=load)
    t, cpu, p99 = [], [], []
    for start in (T0 - DAY - 600, T0 - 600):  # the same load, the same p99 on both days
        for i in range(40):
            busy = 0.5 + (i * 7 % 11) / 10
            t.append(start + 15 * i)
            cpu.append(busy)
            p99.append(0.4 + 0.5 * busy)
    readings = {"t": t, "series": {"process_cpu_seconds_per_s": cpu, "latency_p99_s": p99}}
    found = diagnose(db, now=_at(T0), window_s=600, readings=readings)
    check = next(c for c in found.checks if c.name == "load")
    assert abs(check.detail["cpu_busy_correlation"] - 1.0) < 1e-9
    assert "vs CPU busy r=+1.00" in check.figure and "at like CPU busy" in check.figure
    before, now = check.detail["p99_like_cpu_baseline_s"], check.detail["p99_like_cpu_now_s"]
    assert before is not None and abs(before - now) < 1e-9  # at like CPU busy, no slower: it is load
    assert check.verdict == "suspect"


def test_a_service_on_the_embedded_engine_samples_its_decode_steps(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tmp = tmp_path_factory.mktemp("steps")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    cfg = config(tmp, engine=EngineConfig(registry=registry, version=GOOD, max_batch_size=4, max_seq_len=256,
                                          max_prompt_tokens=128, max_tokens_limit=16))  # fmt: skip
    app = create_app(cfg)
    with TestClient(app, raise_server_exceptions=False) as client:
        body = {"model": GOOD, "prompt": "what is my balance", "max_tokens": 8}
        assert client.post("/v1/completions", json=body, headers=auth()).status_code == 200
        steps = app.state.service.parts.business.steps
        samples = wait_for(lambda: steps.samples(), what="a step sample on the timeseries tick")
        assert {s.version for s in samples} == {GOOD} and 1 in samples[0].decode_s
        assert samples[0].decode_s[1] > 0.0
