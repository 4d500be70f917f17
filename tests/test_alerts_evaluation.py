"""The evaluator: Prometheus' alert states, `for`, `keep_firing_for`, guards, actions once
per episode, and the state change and its notification committed together or not at all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from infersight.alerts import Evaluator
from infersight.alerts.notify import routing as notifier_module
from infersight.alerts.rules.config import parse_config
from infersight.alerts.rules.signals import StaticSignals
from infersight.monitor.store.tables import action_runs, alert_history, alerts, outbox
from sqlalchemy import Engine, func, select
from test_alerts_support import Clock, database

RULES = """
groups:
  - name: g
    interval: 10s
    rules:
      - alert: Slow
        signal: {kind: latency_quantile, metric: request_duration, quantile: 0.99, window: 1m}
        op: ">"
        threshold: 2
        by: [model_version]
        for: 30s
        keep_firing_for: KEEP
        labels: {severity: critical}
        annotations: {summary: "p99 of {{ $labels.model_version }} is {{ $value }}s"}
        actions: [{type: snapshot, cooldown: 0s}]
      - alert: Underused
        signal: {kind: gpu_sm_activity}
        op: "<"
        threshold: 0.7
        by: [gpu]
        while: [{signal: {kind: queue_depth}, op: ">", threshold: 0}]
receivers:
  - name: hook
    webhook: {url: "http://127.0.0.1:9/hook", secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
route: {receiver: hook, group_by: [alertname, model_version], group_wait: 0s, group_interval: 10s, repeat_interval: 4h}
"""


@pytest.fixture
def sqlite_db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    with database("sqlite", tmp_path, request) as engine:
        yield engine


def _setup(
    engine: Engine, keep: str = "0s", group_interval: str = "10s"
) -> tuple[Evaluator, StaticSignals, Clock]:
    clock, signals = Clock(), StaticSignals()
    text = RULES.replace("KEEP", keep).replace("group_interval: 10s", f"group_interval: {group_interval}")
    return Evaluator(engine, parse_config(text), signals, clock=clock), signals, clock


def _outbox(engine: Engine) -> list[dict]:
    with engine.connect() as conn:
        return [json.loads(r.payload) for r in conn.execute(select(outbox).order_by(outbox.c.id))]


def _states(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(select(alert_history).order_by(alert_history.c.id))
        return [(r.from_state, r.to_state) for r in rows]


def test_alert_is_pending_then_fires_after_for_then_resolves(sqlite_db: Engine) -> None:
    ev, signals, clock = _setup(sqlite_db)
    signals.set("latency_quantile", 3.5, model_version="v1", model="m")
    assert [(t.from_state, t.to_state) for t in ev.evaluate().transitions] == [("inactive", "pending")]
    assert _outbox(sqlite_db) == []  # pending alerts are not notified
    clock.advance(20)
    assert ev.evaluate().transitions == ()
    clock.advance(10)
    result = ev.evaluate()
    assert [(t.from_state, t.to_state) for t in result.transitions] == [("pending", "firing")]
    [note] = _outbox(sqlite_db)
    assert note["status"] == "firing" and note["alerts"][0]["annotations"]["summary"] == "p99 of v1 is 3.5s"
    assert note["alerts"][0]["labels"] == {"alertname": "Slow", "model_version": "v1", "severity": "critical"}
    signals.set("latency_quantile", 0.4, model_version="v1", model="m")
    clock.advance(10)
    ev.evaluate()
    clock.advance(10)
    ev.evaluate()  # the group flushes at its interval
    assert [n["status"] for n in _outbox(sqlite_db)] == ["firing", "resolved"]
    assert _states(sqlite_db) == [("inactive", "pending"), ("pending", "firing"), ("firing", "resolved")]


def test_pending_alert_that_clears_never_pages(sqlite_db: Engine) -> None:
    ev, signals, clock = _setup(sqlite_db)
    signals.set("latency_quantile", 3.0, model_version="v1")
    ev.evaluate()
    signals.set("latency_quantile", 1.0, model_version="v1")
    clock.advance(10)
    ev.evaluate()
    assert _states(sqlite_db) == [("inactive", "pending"), ("pending", "inactive")]
    assert _outbox(sqlite_db) == []
    with sqlite_db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(alerts)).scalar() == 0


def test_flapping_signal_pages_once_with_keep_firing_for(sqlite_db: Engine) -> None:
    ev, signals, clock = _setup(sqlite_db, keep="2m")
    signals.set("latency_quantile", 3.0, model_version="v1")
    for _ in range(4):  # fire
        ev.evaluate()
        clock.advance(10)
    for i in range(60):  # then flap around the threshold at every evaluation for 10 minutes
        signals.set("latency_quantile", 3.0 if i % 2 else 1.0, model_version="v1")
        ev.evaluate()
        clock.advance(10)
    assert [n["status"] for n in _outbox(sqlite_db)] == ["firing"]
    signals.set("latency_quantile", 1.0, model_version="v1")
    for _ in range(15):  # quiet for longer than keep_firing_for: resolves once
        ev.evaluate()
        clock.advance(10)
    assert [n["status"] for n in _outbox(sqlite_db)] == ["firing", "resolved"]


def test_without_keep_firing_for_a_flapping_signal_still_pages_at_most_once_per_group_interval(
    sqlite_db: Engine,
) -> None:
    ev, signals, clock = _setup(sqlite_db, group_interval="5m")
    for i in range(120):  # 20 minutes of a 60 s cycle: above for 40 s (`for` is 30 s), below for 20 s
        signals.set("latency_quantile", 3.0 if i % 6 < 4 else 1.0, model_version="v1")
        ev.evaluate()
        clock.advance(10)
    episodes = [s for s in _states(sqlite_db) if s == ("pending", "firing")]
    assert len(episodes) == 20
    assert 1 <= len(_outbox(sqlite_db)) <= 20 * 60 // 300 + 1  # at most one page per group_interval


def test_action_runs_once_per_episode(sqlite_db: Engine) -> None:
    ev, signals, clock = _setup(sqlite_db)

    def keys() -> list[str]:
        with sqlite_db.connect() as conn:
            return [r.run_key for r in conn.execute(select(action_runs).order_by(action_runs.c.id))]

    for value in (3, 3, 3, 3, 3, 1, 3, 3, 3, 3):
        signals.set("latency_quantile", value, model_version="v1")
        ev.evaluate()
        clock.advance(10)
    assert len(keys()) == 2 and all(k.startswith("snapshot:") for k in keys()) and len(set(keys())) == 2


def test_guard_keeps_rule_quiet_when_nothing_is_queued(sqlite_db: Engine) -> None:
    ev, signals, _ = _setup(sqlite_db)
    signals.set("gpu_sm_activity", 0.3, gpu="0", uuid="GPU-0")
    signals.set("queue_depth", 0, model="m", model_version="v1")
    assert ev.evaluate().transitions == ()
    signals.set("queue_depth", 4, model="m", model_version="v1")
    moves = ev.evaluate().transitions  # no `for`: pending and firing in one evaluation
    assert [(t.alertname, t.to_state, dict(t.labels)["gpu"]) for t in moves] == [
        ("Underused", "pending", "0"),
        ("Underused", "firing", "0"),
    ]


def test_failing_signal_source_leaves_other_rules_and_states_alone(sqlite_db: Engine) -> None:
    ev, signals, clock = _setup(sqlite_db)
    signals.set("latency_quantile", 3.0, model_version="v1")
    ev.evaluate()
    real_read = signals.read

    def broken(signal, by):  # type: ignore[no-untyped-def]
        if signal.kind == "latency_quantile":
            raise OSError("sketch store unavailable")
        return real_read(signal, by)

    signals.read = broken  # type: ignore[method-assign]
    clock.advance(60)
    result = ev.evaluate()
    assert result.errors and "sketch store unavailable" in result.errors[0][1]
    with sqlite_db.connect() as conn:
        assert conn.execute(select(alerts.c.state)).scalar() == "pending"


def test_state_change_and_notification_commit_together_or_not_at_all(
    sqlite_db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    ev, signals, clock = _setup(sqlite_db)
    signals.set("latency_quantile", 3.0, model_version="v1")

    def crash(*args: object, **kw: object) -> None:
        raise RuntimeError("power cut between the state change and the outbox write")

    monkeypatch.setattr(notifier_module, "enqueue", crash)
    for _ in range(4):  # pending, then firing: the firing transition needs the outbox write
        try:
            ev.evaluate()
        except RuntimeError:
            break
        clock.advance(10)
    else:
        pytest.fail("the notification was never attempted")
    with sqlite_db.connect() as conn:
        assert conn.execute(select(alerts.c.state)).scalar() == "pending"  # not firing: rolled back
        assert [r.to_state for r in conn.execute(select(alert_history))] == ["pending"]
        assert conn.execute(select(func.count()).select_from(outbox)).scalar() == 0
        assert conn.execute(select(func.count()).select_from(action_runs)).scalar() == 0
    monkeypatch.undo()
    ev.evaluate()  # the next evaluation fires and notifies, nothing was lost
    with sqlite_db.connect() as conn:
        assert conn.execute(select(alerts.c.state)).scalar() == "firing"
        assert conn.execute(select(func.count()).select_from(outbox)).scalar() == 1
        assert conn.execute(select(func.count()).select_from(action_runs)).scalar() == 1
