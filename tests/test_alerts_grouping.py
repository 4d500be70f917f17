"""Alertmanager's semantics inside infersight: grouping, group_wait, group_interval,
repeat_interval, routing, inhibition and silences with expiry."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from infersight.alerts import Evaluator, create_silence, expire_silence, list_silences
from infersight.alerts.errors import InvalidMatcher
from infersight.alerts.notify.matchers import parse_matcher
from infersight.alerts.rules.config import parse_config
from infersight.alerts.rules.signals import StaticSignals
from infersight.monitor.store.tables import outbox
from sqlalchemy import Engine, select
from test_alerts_support import WHSEC, Clock, database

RULES = f"""
groups:
  - name: g
    interval: 10s
    rules:
      - alert: Slow
        signal: {{kind: latency_quantile, metric: request_duration, quantile: 0.99, window: 1m}}
        op: ">"
        threshold: 1
        by: [model_version]
        labels: {{severity: warning}}
      - alert: Slow
        signal: {{kind: latency_quantile, metric: request_duration, quantile: 0.99, window: 1m}}
        op: ">"
        threshold: 2
        by: [model_version]
        labels: {{severity: critical}}
      - alert: Drift
        signal: {{kind: drift_p_value, field: prompt}}
        op: "<"
        threshold: 0.01
        by: [model_version]
        labels: {{severity: warning}}
receivers:
  - name: team
    webhook: {{url: "http://127.0.0.1:9/team", secret: "{WHSEC}"}}
  - name: pager
    pagerduty: {{url: "http://127.0.0.1:9/pd", routing_key: "R0123456789abcdef0123456789abcde"}}
route:
  receiver: team
  group_by: [alertname]
  group_wait: 30s
  group_interval: 5m
  repeat_interval: 1h
  routes:
    - matchers: ['severity="critical"']
      receiver: pager
      group_by: [alertname, model_version]
      group_wait: 0s
inhibit_rules:
  - source_matchers: ['severity="critical"']
    target_matchers: ['severity="warning"']
    equal: [alertname, model_version]
"""


@pytest.fixture
def sqlite_db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    with database("sqlite", tmp_path, request) as engine:
        yield engine


@pytest.fixture
def world(sqlite_db: Engine) -> tuple[Evaluator, StaticSignals, Clock]:
    clock, signals = Clock(), StaticSignals()
    return Evaluator(sqlite_db, parse_config(RULES), signals, clock=clock), signals, clock


def sent(engine: Engine, receiver: str | None = None) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(select(outbox).order_by(outbox.c.id)).all()
    return [json.loads(r.payload) for r in rows if receiver in (None, r.receiver)]


def names(note: dict) -> list[tuple[str, str, str]]:
    return sorted(
        (a["labels"]["alertname"], a["labels"]["model_version"], a["status"]) for a in note["alerts"]
    )


def run(ev: Evaluator, clock: Clock, seconds: float, step: float = 10) -> None:
    end = clock.t + seconds
    while clock.t < end:
        ev.tick()
        clock.advance(step)


def test_group_wait_collects_alerts_into_one_notification(world: tuple, sqlite_db: Engine) -> None:
    ev, signals, clock = world
    signals.set("drift_p_value", 0.001, model_version="v1")
    run(ev, clock, 20)
    signals.set("drift_p_value", 0.002, model_version="v2")
    assert sent(sqlite_db) == []  # still inside group_wait
    run(ev, clock, 20)
    [note] = sent(sqlite_db, "team")
    assert names(note) == [("Drift", "v1", "firing"), ("Drift", "v2", "firing")]
    assert note["groupLabels"] == {"alertname": "Drift"} and note["commonLabels"]["severity"] == "warning"


def test_new_alert_in_a_notified_group_waits_for_group_interval(world: tuple, sqlite_db: Engine) -> None:
    ev, signals, clock = world
    signals.set("drift_p_value", 0.001, model_version="v1")
    run(ev, clock, 40)
    signals.set("drift_p_value", 0.001, model_version="v3")
    run(ev, clock, 200)
    assert len(sent(sqlite_db)) == 1  # not before group_interval (5m after the first flush)
    run(ev, clock, 120)
    _first, second = sent(sqlite_db)
    assert names(second) == [("Drift", "v1", "firing"), ("Drift", "v3", "firing")]


def test_unchanged_group_is_repeated_only_after_repeat_interval(world: tuple, sqlite_db: Engine) -> None:
    ev, signals, clock = world
    signals.set("drift_p_value", 0.001, model_version="v1")
    run(ev, clock, 3599, step=30)
    assert len(sent(sqlite_db)) == 1
    run(ev, clock, 600, step=30)
    assert len(sent(sqlite_db)) == 2
    assert sent(sqlite_db)[1]["alerts"] == sent(sqlite_db)[0]["alerts"]


def test_resolve_is_sent_when_the_group_resolves(world: tuple, sqlite_db: Engine) -> None:
    ev, signals, clock = world
    signals.set("drift_p_value", 0.001, model_version="v1")
    run(ev, clock, 40)
    signals.set("drift_p_value", 0.5, model_version="v1")
    run(ev, clock, 300)
    firing, resolved = sent(sqlite_db)
    assert resolved["status"] == "resolved" and names(resolved) == [("Drift", "v1", "resolved")]
    assert (
        resolved["groupKey"] == firing["groupKey"] and resolved["idempotencyKey"] != firing["idempotencyKey"]
    )
    assert resolved["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"


def test_critical_alert_mutes_its_warning_twin_and_routes_to_the_pager(
    world: tuple, sqlite_db: Engine
) -> None:
    ev, signals, clock = world
    signals.set("latency_quantile", 3.0, model_version="v1")  # over both thresholds
    signals.set("latency_quantile", 1.5, model_version="v2")  # warning only
    run(ev, clock, 40)
    [page] = sent(sqlite_db, "pager")
    assert names(page) == [("Slow", "v1", "firing")] and page["commonLabels"]["severity"] == "critical"
    [team] = sent(sqlite_db, "team")
    assert names(team) == [("Slow", "v2", "firing")]  # v1's warning twin is inhibited


def test_silence_mutes_until_it_expires(world: tuple, sqlite_db: Engine) -> None:
    ev, signals, clock = world
    silence = create_silence(
        sqlite_db,
        [parse_matcher('alertname="Drift"'), parse_matcher("model_version=~v.*")],
        starts_at=clock.now,
        ends_at=clock.now + dt.timedelta(minutes=10),
        created_by="oncall",
        comment="known reference refresh",
        now=clock.now,
    )
    signals.set("drift_p_value", 0.001, model_version="v1")
    run(ev, clock, 300)
    assert sent(sqlite_db) == []
    assert [s.id for s in list_silences(sqlite_db, now=clock.now)] == [silence.id]
    assert expire_silence(sqlite_db, silence.id, now=clock.now)
    assert not expire_silence(sqlite_db, silence.id, now=clock.now)  # already expired
    assert list_silences(sqlite_db, now=clock.now) == []
    run(ev, clock, 330)
    [note] = sent(sqlite_db)
    assert names(note) == [("Drift", "v1", "firing")]


def test_silence_that_would_match_everything_is_refused(sqlite_db: Engine) -> None:
    now = dt.datetime.now(dt.UTC)
    with pytest.raises(InvalidMatcher):
        create_silence(
            sqlite_db,
            [parse_matcher("alertname=~.*")],
            starts_at=now,
            ends_at=now + dt.timedelta(hours=1),
            created_by="x",
            comment="",
            now=now,
        )
    with pytest.raises(InvalidMatcher):
        create_silence(
            sqlite_db, [parse_matcher("a=b")], starts_at=now, ends_at=now, created_by="x", comment="", now=now
        )


def test_silencing_a_paged_alert_acknowledges_it_in_pagerduty_and_expiry_pages_again(
    world: tuple, sqlite_db: Engine
) -> None:
    ev, signals, clock = world
    signals.set("latency_quantile", 3.0, model_version="v1")
    run(ev, clock, 10)
    silence = create_silence(
        sqlite_db,
        [parse_matcher('alertname="Slow"'), parse_matcher('model_version="v1"')],
        starts_at=clock.now,
        ends_at=clock.now + dt.timedelta(hours=2),
        created_by="oncall",
        comment="on it",
        now=clock.now,
    )
    run(ev, clock, 300)
    assert [n["status"] for n in sent(sqlite_db, "pager")] == ["firing", "acknowledged"]
    assert names(sent(sqlite_db, "pager")[1]) == [("Slow", "v1", "firing")]  # still firing, now owned
    assert sent(sqlite_db, "team") == []  # its warning twin stays inhibited; webhooks get no acknowledge
    expire_silence(sqlite_db, silence.id, now=clock.now)
    run(ev, clock, 300)
    assert [n["status"] for n in sent(sqlite_db, "pager")] == ["firing", "acknowledged", "firing"]
