"""The parts behind several replicas on one database, in process: windows published by one
replica merge exactly into another's; a model action fans out to one run per target
replica, each claimed by its replica alone; a due post-deploy check is leased to one
replica. (The whole system, as real processes: test_replicas.py.)"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from infersight.alerts import ActionRunner, DeployAnalyzer, LiveSignals
from infersight.alerts.release.post_deploy import VersionStats
from infersight.alerts.rules.rules import ActionSpec
from infersight.alerts.rules.signals import Signal
from infersight.collectors import InferenceStats, MergedStats, RemoteStats, SlotExporter
from infersight.monitor.service.replicas import Replicas
from infersight.monitor.store.tables import action_runs, deploy_analyses
from sqlalchemy import Engine, select
from test_alerts_support import Clock, database


@dataclass(frozen=True)
class GPU:
    uuid: str
    sm_activity: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None


@dataclass(frozen=True)
class Process:
    pid: int
    rss_bytes: int


@dataclass
class Readings:
    """A collector's `latest()`."""

    value: Any

    def latest(self) -> Any:
        return self.value


class StatsClock:
    """A stats clock (like perf_counter) with its own origin, and the epoch clock beside it."""

    def __init__(self, origin: float, epoch: float) -> None:
        self.t = origin
        self.origin = origin
        self.epoch0 = epoch

    def __call__(self) -> float:
        return self.t

    def epoch(self) -> float:
        return self.epoch0 + (self.t - self.origin)


def test_a_replicas_published_windows_merge_exactly_into_the_leaders_quantiles_and_counts() -> None:
    epoch = 1_800_000_000.0
    rng = random.Random(7)
    follower_clock, leader_clock, both_clock = (
        StatsClock(123.4, epoch),
        StatsClock(9876.5, epoch),
        StatsClock(0.0, epoch),
    )
    follower = InferenceStats(interval_s=10.0, window_s=600.0, clock=follower_clock)
    leader = InferenceStats(interval_s=10.0, window_s=600.0, clock=leader_clock)
    both = InferenceStats(interval_s=10.0, window_s=600.0, clock=both_clock)  # one process seeing it all
    exporter = SlotExporter(follower, epoch_clock=follower_clock.epoch)
    published: list[Any] = []
    for step in range(120):  # 2 minutes, a request a second on each replica
        for c in (follower_clock, leader_clock, both_clock):
            c.t += 1.0
        slow, fast = rng.lognormvariate(0.5, 0.6), rng.lognormvariate(-2.0, 0.3)
        follower.add(
            model="m", model_version="v2", duration_s=slow, error_type="timeout" if step % 10 == 0 else None
        )
        leader.add(model="m", model_version="v1", duration_s=fast)
        both.add(
            model="m", model_version="v2", duration_s=slow, error_type="timeout" if step % 10 == 0 else None
        )
        both.add(model="m", model_version="v1", duration_s=fast)
        if step % 7 == 0:
            published = _keep_latest(published, exporter.changed())
    published = _keep_latest(published, exporter.changed())
    assert exporter.changed() == [], "nothing changed since: nothing to publish"

    merged = MergedStats(leader, lambda: RemoteStats(tuple(published)), epoch_clock=leader_clock.epoch)
    assert sorted(merged.labels()) == [("m", "v1"), ("m", "v2")]
    for q in (0.5, 0.9, 0.99, 1.0):
        for version in (None, "v1", "v2"):
            assert merged.quantile("request_duration", q, 300.0, model_version=version) == both.quantile(
                "request_duration", q, 300.0, model_version=version
            ), (q, version)
    assert merged.count(300.0) == both.count(300.0) == 240
    assert merged.count(300.0, model_version="v2", errors_only=True) == 12
    assert leader.quantile("request_duration", 0.99, 300.0, model_version="v2") is None  # the bug: unseen


def _keep_latest(old: list[Any], new: list[Any]) -> list[Any]:
    """What the store keeps: one row per (model, version, interval), the latest written."""
    rows = {(r.model, r.model_version, r.slot): r for r in old}
    rows.update({(r.model, r.model_version, r.slot): r for r in new})
    return list(rows.values())


@pytest.fixture(params=["sqlite", "postgresql"])
def db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    with database(request.param, tmp_path, request) as engine:
        yield engine


class Control:
    def __init__(self, serving: str, previous: str) -> None:
        self.serving, self.previous, self.rollbacks = serving, previous, 0

    def serving_version(self) -> str | None:
        return self.serving

    def rollback(self) -> None:
        self.serving, self.rollbacks = self.previous, self.rollbacks + 1

    def deploy(self, version: str) -> None:
        self.serving = version

    def failover(self, version: str) -> None:
        self.serving = version


class Targets:
    def __init__(self, serving: dict[str, str]) -> None:
        self.serving = serving

    def replicas_for(self, labels: Any) -> list[str]:
        version = labels.get("model_version")
        return sorted(r for r, v in self.serving.items() if version in (None, v))


def test_a_rollback_runs_on_each_replica_serving_the_version_once_and_nowhere_else(
    db: Engine, tmp_path: Path
) -> None:
    clock = Clock()
    targets = Targets({"r1": "v2", "r2": "v2", "r3": "v1"})
    controls = {r: Control(v, "v1" if v == "v2" else "v0") for r, v in targets.serving.items()}
    runners = {
        r: ActionRunner(
            db, data_dir=tmp_path / r, control=controls[r], clock=clock, replica=r, targets=targets
        )
        for r in controls
    }
    spec = ActionSpec("rollback", cooldown_s=1800.0, daily_cap=2)
    outcome = runners["r3"].run(
        spec, trigger="rule", key="ep-1", alertname="SlowVersion", labels={"model_version": "v2"}
    )
    assert outcome.state == "dispatched" and outcome.detail["replicas"] == ["r1", "r2"]
    assert controls["r3"].rollbacks == 0, "r3 serves v1: not its fault"
    assert runners["r3"].run_pending(own_only=True) == []
    (r1,) = runners["r1"].run_pending(own_only=True)
    (r2,) = runners["r2"].run_pending(own_only=True)
    assert (r1.state, r2.state) == ("succeeded", "succeeded"), "the cooldown is per replica"
    assert [c.rollbacks for c in controls.values()] == [1, 1, 0]
    assert runners["r1"].run_pending() == [] and runners["r2"].run_pending(own_only=True) == []
    again = runners["r1"].run(spec, trigger="rule", key="ep-1", labels={"model_version": "v2"})
    assert again.duplicate and [c.rollbacks for c in controls.values()] == [1, 1, 0]
    with db.connect() as conn:
        rows = conn.execute(
            select(action_runs.c.state, action_runs.c.replica).order_by(action_runs.c.id)
        ).all()
    assert [tuple(r) for r in rows] == [("dispatched", None), ("succeeded", "r1"), ("succeeded", "r2")]

    # asked for on a replica that is a target: its part runs right there, on the row asked for
    here = runners["r1"].run(
        ActionSpec("rollback", cooldown_s=0.0), trigger="rule", key="ep-3", labels={"model_version": "v2"}
    )
    assert (here.state, here.detail["replicas"]) == ("succeeded", ["r1", "r2"])
    (there,) = runners["r2"].run_pending(own_only=True)
    assert there.state == "succeeded" and [c.rollbacks for c in controls.values()] == [2, 2, 0]


def test_an_action_for_a_version_no_replica_serves_is_refused_not_run_on_the_wrong_runtime(
    db: Engine, tmp_path: Path
) -> None:
    control = Control("v1", "v0")
    runner = ActionRunner(
        db, data_dir=tmp_path, control=control, clock=Clock(), replica="r1", targets=Targets({"r1": "v1"})
    )
    outcome = runner.run(ActionSpec("rollback"), trigger="rule", key="ep-2", labels={"model_version": "v9"})
    assert outcome.state == "refused" and outcome.detail["refused"] == "no_replica"
    assert control.rollbacks == 0 and control.serving == "v1"


class BlockingMetrics:
    """Figures for the analysis; while the first check runs, the other replica ticks."""

    def __init__(self) -> None:
        self.calls = 0
        self.during: Any = None
        self.other: DeployAnalyzer | None = None

    def stats(self, version: str, since: dt.datetime, until: dt.datetime) -> VersionStats:
        self.calls += 1
        if self.other is not None and self.during is None:
            self.during = self.other.tick()
        return VersionStats(50, 0.0, 0.1, None)

    def output_drift_p_value(self, new: str, old: str, since: dt.datetime) -> float | None:
        return None


def test_a_due_post_deploy_check_is_run_by_one_replica_and_one_deploy_is_one_analysis(
    db: Engine, tmp_path: Path
) -> None:
    clock = Clock()
    metrics = BlockingMetrics()
    a, b = (
        DeployAnalyzer(db, metrics, ActionRunner(db, data_dir=tmp_path, clock=clock), clock=clock, owner=name)
        for name in ("a", "b")
    )
    first = a.on_deploy("v2", "v1", clock.now)
    assert b.on_deploy("v2", "v1", clock.now) == first, "the other replica's report of the same deploy"
    clock.advance(61.0)
    metrics.other = b
    checks = a.tick()
    assert len(checks) == 1 and metrics.during == [], "b found the check leased to a"
    assert metrics.calls == 2  # new and old version of a's one check
    with db.connect() as conn:
        rows = conn.execute(select(deploy_analyses.c.state, deploy_analyses.c.checks)).all()
    assert [tuple(r) for r in rows] == [("running", 1)]


def test_replicas_on_one_database_see_each_others_traffic_and_the_targets_of_an_action(
    db: Engine, tmp_path: Path
) -> None:
    clock = Clock()
    stats = {name: InferenceStats(interval_s=10.0, window_s=600.0, clock=clock) for name in ("a", "b", "c")}
    serving = {"a": "v1", "b": "v2", "c": "v2"}
    gpus = {
        name: Readings({0: GPU(f"GPU-{name}", 0.5, 4 << 30 if name == "c" else 1 << 30, 8 << 30)})
        for name in stats
    }
    processes = {name: Readings(Process(1, 1 << 30)) for name in stats}  # pid 1 everywhere, as in containers
    replicas = {
        name: Replicas(
            db, stats[name], serving_version=lambda n=name: serving[n], replica_id=name, clock=clock,
            gpu=gpus[name], process=processes[name],
        )
        for name in stats
    }  # fmt: skip
    for i in range(40):
        stats["b"].add(model="m", model_version="v2", duration_s=2.0 + i / 100)
        stats["a"].add(model="m", model_version="v1", duration_s=0.1)
    for r in replicas.values():
        r.publish()
    clock.advance(1.0)
    leader = replicas["a"].merged
    assert leader.count(300.0, model_version="v2") == 40
    assert leader.quantile("request_duration", 1.0, 300.0, model_version="v2") == pytest.approx(
        2.39, rel=0.01
    )
    assert replicas["a"].replicas_for({"model_version": "v2"}) == ["b"], "c serves v2 too, but no requests"
    assert replicas["a"].replicas_for({"model_version": "v1"}) == ["a"]
    assert replicas["a"].replicas_for({"model_version": "v9"}) == []
    assert replicas["a"].replicas_for({"uuid": "GPU-c"}) == ["c"]
    assert replicas["b"].replicas_for({"replica": "a"}) == ["a"]
    assert replicas["c"].publish() == 0, "nothing changed: nothing written"

    live = LiveSignals(
        leader, gpu=gpus["a"], process=processes["a"], replica="a", remote=replicas["a"].remote_resources
    )
    memory = live.read(Signal("gpu_memory_ratio"), ["uuid", "replica"])
    assert sorted((s.label_dict()["replica"], s.label_dict()["uuid"], s.value) for s in memory) == [
        ("a", "GPU-a", 0.125), ("b", "GPU-b", 0.125), ("c", "GPU-c", 0.5)
    ]  # fmt: skip
    rss = live.read(Signal("memory_slope", resource="process", window_s=60.0), ["pid", "replica"])
    assert rss == [], "one reading each so far: no slope yet"

    runner = ActionRunner(
        db, data_dir=db.url.database or ".", clock=clock, replica="a", targets=replicas["a"]
    )
    dispatched = runner.run(
        ActionSpec("rollback"), trigger="rule", key="ep-9", labels={"model_version": "v2"}
    )
    assert dispatched.state == "dispatched" and dispatched.detail["replicas"] == ["b"]
    replicas[
        "b"
    ].withdraw()  # stopped cleanly before running it: no longer a target; its requests still count
    clock.advance(1.0)
    assert replicas["a"].replicas_for({"model_version": "v2"}) == ["c"]
    assert replicas["a"].merged.count(300.0, model_version="v2") == 40
    replicas["a"].prune()
    with db.connect() as conn:
        left = conn.execute(
            select(action_runs.c.state, action_runs.c.detail).where(action_runs.c.replica == "b")
        ).one()
    assert left.state == "refused" and "replica_gone" in left.detail, "not pending forever for a runtime gone"
    clock.advance(15.0)  # c's heartbeat is stale now (no publish): gone
    assert replicas["a"].replicas_for({"model_version": "v2"}) == []
