"""The `collect` action keeps the next N requests of the drifted kind for export: queued by a
firing rule, run once per alert episode, filled with only the requests that arrive after it
ran (of the alerted version, or any version, or the failed ones), kept past the requests'
retention, and refused in the rule file with file:line when its parameters are wrong.
SQLite and the real PostgreSQL."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from _store_helpers import request_row
from infersight.alerts import ActionRunner, Evaluator, RuleParseError, load_config
from infersight.alerts.rules.rules import ActionSpec
from infersight.alerts.rules.signals import StaticSignals
from infersight.monitor.dataset import DatasetQuery, fill_collections, iter_dataset
from infersight.monitor.store import RetentionPolicy, enforce_retention
from infersight.monitor.store.tables import dataset_collections, dataset_items, requests
from sqlalchemy import Engine, func, insert, select
from test_alerts_support import Clock, database

V1, V2 = "mixtral_banking_fp32-v1.0", "mixtral_banking_fp32-v1.1"

RULES = """groups:
  - name: quality
    rules:
      - alert: PromptDrift
        signal: {kind: drift_p_value, field: prompt}
        op: '<'
        threshold: 0.01
        by: [model_version]
        actions: [{type: collect, n: 4}]
"""


@pytest.fixture(params=["sqlite", "postgres"])
def db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    with database(request.param, tmp_path, request) as engine:
        yield engine


def _traffic(engine: Engine, start: dt.datetime, first: int, n: int, **extra: object) -> None:
    with engine.begin() as conn:
        conn.execute(insert(requests), [
            {**request_row(first + i, at=start + dt.timedelta(seconds=i), **extra), "relevance": None}  # type: ignore[arg-type]
            for i in range(n)
        ])  # fmt: skip


def _kept(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(select(dataset_items.c.request_id).order_by(dataset_items.c.started_at)).scalars()
        )


def test_a_drift_alert_collects_the_next_n_requests_of_its_version_once(db: Engine, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    clock, signals = Clock(), StaticSignals()
    _traffic(db, clock.now - dt.timedelta(minutes=5), 0, 10, version=V2)  # before the alert: not collected
    evaluator = Evaluator(db, load_config(rules, env={}), signals, clock=clock)
    runner = ActionRunner(db, data_dir=tmp_path, clock=clock)
    signals.set("drift_p_value", 0.001, model_version=V2)
    for _ in range(3):  # the alert keeps firing: its episode's action runs once
        evaluator.evaluate()
        runner.run_pending()
        clock.advance(15)
    with db.connect() as conn:
        [collection] = conn.execute(select(dataset_collections)).all()
    assert (collection.kind, collection.model_version, collection.n, collection.reason) == (
        "version", V2, 4, "PromptDrift"
    )  # fmt: skip
    assert fill_collections(db) == 0  # nothing has arrived since

    after = clock.now
    _traffic(db, after, 100, 2, version=V1)  # another version's traffic
    _traffic(db, after, 200, 1, version=V2, prompt=None, response=None)  # text not sampled: nothing to keep
    _traffic(db, after + dt.timedelta(seconds=5), 300, 3, version=V2, system_prompt="answer briefly")
    assert fill_collections(db) == 3
    assert fill_collections(db) == 0  # a second fill keeps nothing twice
    _traffic(db, after + dt.timedelta(seconds=10), 400, 5, version=V2)
    assert fill_collections(db) == 1  # only what the collection still lacked
    assert _kept(db) == ["req-300", "req-301", "req-302", "req-400"]
    with db.connect() as conn:
        done = conn.execute(select(dataset_collections.c.collected, dataset_collections.c.done_at)).one()
    assert done.collected == 4 and done.done_at is not None

    # the requests go with retention; what was collected stays exportable
    enforce_retention(db, RetentionPolicy(requests_days=1), now=clock.now + dt.timedelta(days=3))
    with db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(requests)).scalar_one() == 0
    exported = list(iter_dataset(db, DatasetQuery(V2, "collected")))
    assert [r["request_id"] for r in exported] == ["req-300", "req-301", "req-302", "req-400"]
    assert exported[0]["prompt"] == "how do I top up my card 300" and exported[0]["answer"]
    assert exported[0]["system_prompt"] == "answer briefly" and exported[-1]["system_prompt"] is None


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("any", ["req-100", "req-101", "req-102"]), ("failed", ["req-101"])],
)
def test_collect_after_a_rollback_keeps_what_any_version_serves_or_the_failures(
    db: Engine, tmp_path: Path, kind: str, expected: list[str]
) -> None:
    clock = Clock()
    runner = ActionRunner(db, data_dir=tmp_path, clock=clock)
    spec = ActionSpec("collect", (("kind", kind), ("n", 3)))
    first = runner.run(spec, trigger="rule", key="episode-1", alertname="ErrorRateSpike",
                       labels={"model_version": V2})  # fmt: skip
    again = runner.run(spec, trigger="rule", key="episode-1", alertname="ErrorRateSpike",
                       labels={"model_version": V2})  # fmt: skip
    assert first.state == "succeeded" and again.duplicate and again.run_id == first.run_id
    # after the rollback the previous version serves the same traffic
    _traffic(db, clock.now, 100, 1, version=V1)
    _traffic(db, clock.now + dt.timedelta(seconds=1), 101, 1, version=V1, error_type="GenerationFailed")
    _traffic(db, clock.now + dt.timedelta(seconds=2), 102, 4, version=V1)
    fill_collections(db)
    assert _kept(db) == expected
    with db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(dataset_collections)).scalar_one() == 1


def test_collect_of_the_alerted_version_with_no_version_known_is_refused_not_paged(
    db: Engine, tmp_path: Path
) -> None:
    out = ActionRunner(db, data_dir=tmp_path, clock=Clock()).run(ActionSpec("collect", (("n", 3),)))
    assert out.state == "refused" and out.detail["refused"] == "bad_parameters"
    assert "names no model_version" in out.detail["reason"]


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ("{type: collect, n: 0}", "n must be an integer in 1..100000"),
        ("{type: collect, n: many}", "n must be an integer in 1..100000"),
        ("{type: collect, kind: nearby}", "unknown collect kind 'nearby'; valid kinds: version, any, failed"),
        ("{type: collect, requests: 5}", "action collect takes no 'requests'"),
        ("{type: snapshot, n: 5}", "action snapshot takes no 'n'"),
    ],
)
def test_a_bad_collect_action_is_refused_at_load_with_file_and_line(
    tmp_path: Path, action: str, reason: str
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.replace("actions: [{type: collect, n: 4}]", f"actions:\n          - {action}"))
    with pytest.raises(RuleParseError) as info:
        load_config(rules, env={})
    assert str(info.value).startswith(f"{rules}:10: ") and reason in info.value.reason


def test_a_collect_action_in_a_rule_file_loads_with_its_defaults(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.replace("{type: collect, n: 4}", "{type: collect}"))
    [rule] = load_config(rules, env={}).rules
    assert rule.actions[0].type == "collect" and dict(rule.actions[0].params) == {"n": 200, "kind": "version"}
