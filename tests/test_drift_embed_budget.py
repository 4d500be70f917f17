"""The streaming embed job's CPU budget (`drift.embed_cpu`, monitor/service/wiring_drift.py).

Each `embed` tick takes as many texts as `drift.embed_cpu` of one CPU buys over the tick at
the CPU a text measured to cost, at most `drift.reservoir`: a faster embedder embeds more of
what it is offered for the same CPU, a slower one fewer, never more CPU. The CPU clock is a
controlled one here (the embedders below charge it per text), never the wall clock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from infersight.monitor.drift import DetectorConfig, DriftDetector
from infersight.monitor.service.config import DriftConfig
from infersight.monitor.service.pipeline import SampledText, TextReservoir
from infersight.monitor.service.wiring_drift import (
    DriftWiring,
    EmbedBudget,
    FirstUseEmbedder,
    runtime_threads,
)
from infersight.monitor.store.database import connect, sqlite_url, upgrade
from prometheus_client import CollectorRegistry, generate_latest


class CpuClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ChargingEmbedder:
    """Deterministic unit vectors; each text encoded charges `per_text` CPU seconds to `clock`."""

    name = "charging-test-embedder"

    def __init__(self, clock: CpuClock, per_text: float) -> None:
        self.clock = clock
        self.per_text = per_text
        self.texts = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.clock.now += self.per_text * len(texts)
        self.texts += len(texts)
        rows = np.zeros((len(texts), 384), np.float32)
        for k, text in enumerate(texts):
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
            rows[k] = np.random.default_rng(seed).standard_normal(384)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True).clip(1e-9)


def _wiring(
    tmp_path: Path, embedder: object, clock: CpuClock, **drift: object
) -> tuple[DriftWiring, TextReservoir, CollectorRegistry]:
    engine = connect(sqlite_url(tmp_path))
    upgrade(engine)
    registry = CollectorRegistry()
    config = DriftConfig(**drift)
    reservoir = TextReservoir(config.reservoir)
    detector = DriftDetector(embedder, config=DetectorConfig())
    wiring = DriftWiring(
        config, engine, registry, reservoir, detector=detector, interval_s=2.0, cpu_clock=clock
    )
    return wiring, reservoir, registry


def _offer(reservoir: TextReservoir, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        reservoir.offer(SampledText(f"r{i}", "m", "v1", 0.0, f"how do I top up card {i}?", f"in the app {i}"))


def _metric(registry: CollectorRegistry, name: str) -> float:
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exposed")


def test_the_budget_sizes_ticks_from_the_measured_cpu_per_text() -> None:
    budget = EmbedBudget(0.25, 2.0, ceiling=1024, floor=16, start=64)
    assert budget.capacity == 64 and budget.cpu_per_text is None  # nothing measured yet
    assert budget.spent(0.64, 64) == 50  # 10 ms a text: 0.25 CPU x 2 s buys 50 texts
    for _ in range(30):
        budget.spent(0.002 * 50, 50)  # the cache warms: 2 ms a text from now on
    assert budget.capacity in (249, 250) and budget.cpu_per_text == pytest.approx(0.002, rel=1e-3)
    for _ in range(30):
        budget.spent(0.0, 250)  # free texts (all cache hits): never past the ceiling
    assert budget.capacity == 1024
    for _ in range(40):
        budget.spent(1.0, 10)  # 100 ms a text: never under the floor
    assert budget.capacity == 16
    assert budget.spent(0.5, 0) == 16 and budget.spent(float("nan"), 5) == 16  # no texts, no clock: kept


def test_no_budget_means_the_reservoir_alone_bounds_a_tick() -> None:
    budget = EmbedBudget(None, 2.0, ceiling=300)
    assert budget.capacity == 300 and budget.spent(60.0, 10) == 300
    with pytest.raises(ValueError):
        EmbedBudget(0.0, 2.0, ceiling=10)
    with pytest.raises(ValueError):
        EmbedBudget(0.5, 2.0, ceiling=10, floor=20)


def test_the_job_keeps_to_its_share_and_a_faster_embedder_embeds_more_for_it(tmp_path: Path) -> None:
    """Offered far more than the budget buys, tick after tick: the CPU the job took over the
    ticks is the share asked for, and an embedder 5x cheaper per text embeds 5x the texts."""
    embedded: dict[str, float] = {}
    for name, per_text in (("slow", 0.006), ("fast", 0.0012)):
        clock = CpuClock()
        embedder = ChargingEmbedder(clock, per_text)
        wiring, reservoir, registry = _wiring(
            tmp_path / name, embedder, clock, embed_cpu=0.25, reservoir=4096
        )
        ticks, offered = 40, 0
        for _ in range(ticks):
            _offer(reservoir, 2000, start=offered)
            offered += 2000
            wiring.embed()
        cpu = _metric(registry, "infersight_drift_embed_cpu_seconds_total")
        assert cpu == pytest.approx(clock.now)
        # each item is a prompt and a response: two texts; the first ticks run at the start size
        per_item = 2 * per_text
        assert _metric(registry, "infersight_drift_embed_capacity") == int(0.25 * 2.0 / per_item)
        assert reservoir.capacity == int(0.25 * 2.0 / per_item)
        assert cpu / ticks <= 0.25 * 2.0 + per_item  # the first ticks ran at the start size, under it
        last, steady = 30, embedder.texts  # from now on each tick spends the tick's budget
        for _ in range(last):
            _offer(reservoir, 2000, start=offered)
            offered += 2000
            wiring.embed()
        assert (embedder.texts - steady) / last == pytest.approx(2 * int(0.25 * 2.0 / per_item))
        assert (clock.now - cpu) / last == pytest.approx(0.5, abs=per_item)  # 0.25 CPU x 2 s a tick
        assert reservoir.skipped_total > 0  # what the budget did not buy is counted as skipped
        embedded[name] = (embedder.texts - steady) / last
    assert embedded["fast"] == pytest.approx(5 * embedded["slow"], rel=0.02)


def test_the_reservoir_ceiling_holds_whatever_the_budget_buys(tmp_path: Path) -> None:
    clock = CpuClock()
    wiring, reservoir, registry = _wiring(
        tmp_path, ChargingEmbedder(clock, 1e-6), clock, embed_cpu=4.0, reservoir=300
    )
    for k in range(5):
        _offer(reservoir, 1000, start=1000 * k)
        assert wiring.embed() <= 300
    assert reservoir.capacity == 300 and _metric(registry, "infersight_drift_embed_capacity") == 300


def test_making_the_embedder_at_first_use_is_not_counted_as_a_text_cost(tmp_path: Path) -> None:
    """`auto` exports and times the runtimes at the first tick (tens of seconds on a new
    machine): that is made before the tick's clock starts, or the budget would shrink the
    reservoir to its floor for many ticks."""
    clock = CpuClock()
    inner = ChargingEmbedder(clock, 0.004)

    def make() -> ChargingEmbedder:
        clock.now += 60.0  # the export
        return inner

    wiring, reservoir, registry = _wiring(tmp_path, FirstUseEmbedder(make), clock, embed_cpu=0.25)
    _offer(reservoir, 64)
    assert wiring.embed() == 64
    assert _metric(registry, "infersight_drift_embed_cpu_seconds_total") == pytest.approx(64 * 2 * 0.004)
    assert reservoir.capacity == int(0.25 * 2.0 / (2 * 0.004))


def test_resizing_the_reservoir_drops_at_random_and_counts_what_it_dropped() -> None:
    skipped: list[int] = []
    reservoir = TextReservoir(100, on_skip=skipped.append)
    _offer(reservoir, 100)
    reservoir.resize(40)
    assert len(reservoir) == 40 and reservoir.capacity == 40 and sum(skipped) == 60
    assert reservoir.skipped_total == 60
    kept = {int(t.request_id[1:]) for t in reservoir.drain()}
    assert len(kept) == 40 and max(kept) > 40  # a sample of all, not the first 40
    reservoir.resize(80)
    _offer(reservoir, 80)
    assert len(reservoir) == 80 and sum(skipped) == 60
    with pytest.raises(ValueError):
        reservoir.resize(0)


def test_the_clock_is_the_job_thread_only_where_the_runtime_computes_on_it() -> None:
    class Runtime:
        def __init__(self, threads: int) -> None:
            self.threads = threads

    class Wrapper:
        def __init__(self, inner: object) -> None:
            self.inner = inner

    assert runtime_threads(Wrapper(Runtime(1))) == 1
    assert runtime_threads(FirstUseEmbedder(lambda: Wrapper(Runtime(2)))) == 2
    assert runtime_threads(Wrapper(object())) is None  # says nothing: the process clock is used


def test_the_service_exposes_the_budget_and_keeps_no_texts_with_drift_off(tmp_path: Path) -> None:
    import dataclasses

    from _service_support import auth, config, event, running
    from infersight.monitor.service.config import ScheduleConfig

    events = [event(i, prompt=f"how do I freeze card {i}?", response="in the app") for i in range(300)]
    with running(config(tmp_path / "off")) as (app, client):  # drift off (the helper's default)
        assert (
            client.post("/api/v1/events", json={"events": events}, headers=auth()).json()["accepted"] == 300
        )
        assert app.state.service.reservoir is None  # no text is kept for an embedding that never runs
        assert "infersight_drift_texts_offered_total 0.0" in client.get("/metrics").text
    quiet = ScheduleConfig(embed_s=3600.0, drift_s=3600.0)  # the ticks never run: nothing is embedded
    on = dataclasses.replace(
        config(tmp_path / "on"), drift=DriftConfig(embed_cpu=0.5, reservoir=500), schedule=quiet
    )
    with running(on) as (app, client):
        assert (
            client.post("/api/v1/events", json={"events": events}, headers=auth()).json()["accepted"] == 300
        )
        metrics = client.get("/metrics").text
        assert "infersight_drift_texts_offered_total 300.0" in metrics
        # before any tick is measured a tick takes the budget's start size, 64
        assert "infersight_drift_embed_capacity 64.0" in metrics
        assert "infersight_drift_texts_skipped_total 236.0" in metrics
        assert "infersight_drift_embed_cpu_seconds_total 0.0" in metrics
        assert len(app.state.service.reservoir) == 64
