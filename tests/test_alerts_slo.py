"""SLOs declared in the rule file: validated with file:line, turned into multi-window,
multi-burn-rate alerts that the same evaluator runs over the SLO ledger, exported as
Prometheus recording + alert rules that the real promtool checks and unit-tests (a fast burn
pages within minutes, a slow burn only over hours)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import require_executable
from infersight.alerts import Evaluator, RuleParseError, SLOLedger
from infersight.alerts.rules.config import parse_config
from infersight.alerts.rules.rules import render
from infersight.monitor.cli import main
from infersight.monitor.records import SHED, InferenceRecord
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import Engine
from test_alerts_support import Clock, database

SLOS = """
groups: []
slos:
  - {name: banking-latency, model: m, objective: 0.999, threshold_ms: 100, window: 30d}
  - {name: availability, objective: 0.99, window: 30d}
  - {name: fast-latency, path: fast, objective: 0.999, threshold_ms: 50, window: 30d}
"""


@pytest.fixture
def sqlite_db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    with database("sqlite", tmp_path, request) as engine:
        yield engine


def _record(i: int, duration_s: float, error_type: str | None = None, model: str = "m") -> InferenceRecord:
    return InferenceRecord(f"r{i}", model, "v1", 1.7e9, duration_s, error_type=error_type)


def test_slos_become_burn_rate_alerts_of_the_slo_group() -> None:
    config = parse_config(SLOS, "rules.yaml")
    assert [s.name for s in config.slos] == ["banking-latency", "availability", "fast-latency"]
    lat = config.slos[0]
    assert (lat.kind, lat.threshold_s, lat.selector) == ("latency", 0.1, (("model", "m"),))
    assert config.slos[1].kind == "availability" and config.slos[2].selector == (("path", "fast"),)
    rules = [r for r in config.rules if dict(r.labels)["slo"] == "banking-latency"]
    got = [
        (r.name, r.severity, r.condition.signal.window_s, r.while_[0].signal.window_s, r.condition.threshold)
        for r in rules
    ]
    assert got == [
        ("SLOFastBurn", "critical", 3600, 300, 14.4),
        ("SLOSlowBurn", "critical", 21600, 1800, 6.0),
        ("SLOBudgetTicket", "warning", 259200, 21600, 1.0),
    ]
    assert {r.group for r in config.rules} == {"slo"}


@pytest.mark.parametrize(
    ("entry", "line", "reason"),
    [
        ("{name: a, objective: 1.5, window: 30d}", 4, "objective must be a number in (0, 1)"),
        ("{name: a, objective: 0.99, window: 30d, threshold_ms: 123}", 4, "boundary of the request-duration"),
        ("{name: a, objective: 0.99, window: 30d, threshold_ms: -5}", 4, "threshold_ms must be a positive"),
        ("{name: a, objective: 0.99, window: 10m}", 4, "window must be at least 1h"),
        ("{name: a, objective: 0.99, window: soon}", 4, "not a duration"),
        ("{name: a, objective: 0.99, window: 30d, route: fast}", 4, "route"),
        ("{objective: 0.99, window: 30d}", 4, "name"),
    ],
)
def test_bad_slo_is_refused_with_file_and_line(entry: str, line: int, reason: str) -> None:
    text = f"groups: []\nslos:\n  - {{name: ok, objective: 0.9, window: 1d}}\n  - {entry}\n"
    with pytest.raises(RuleParseError) as info:
        parse_config(text, "rules.yaml")
    assert info.value.line == line and str(info.value).startswith(f"rules.yaml:{line}:")
    assert reason in str(info.value)


def test_duplicate_slo_and_unknown_slo_in_a_rule_are_refused() -> None:
    dup = "groups: []\nslos:\n  - {name: a, objective: 0.9, window: 1d}\n  - {name: a, objective: 0.9, window: 2d}\n"
    with pytest.raises(RuleParseError, match=r"rules.yaml:4: duplicate slo name 'a' \(first at line 3\)"):
        parse_config(dup, "rules.yaml")
    unknown = """
groups:
  - name: g
    rules:
      - alert: Burn
        signal: {kind: slo_burn_rate, slo: nope, window: 1h}
        op: ">"
        threshold: 2
"""
    with pytest.raises(RuleParseError, match=r"rules.yaml:5: rule 'Burn': slo 'nope' is not declared"):
        parse_config(unknown, "rules.yaml")


def test_ledger_counts_bad_requests_and_client_errors_spend_no_budget() -> None:
    clock = Clock()
    ledger = SLOLedger(parse_config(SLOS).slos, clock=clock)
    for i in range(100):
        ledger.observe(_record(i, 0.25 if i < 2 else 0.05))  # 2 slow
    for i in range(100, 110):
        ledger.observe(_record(i, 0.01, error_type="client_error"))
        ledger.observe(_record(i + 50, 0.01, error_type="cancelled" if i % 2 else "ClientDisconnected"))
    ledger.observe(_record(200, 0.01, error_type="RuntimeError"))  # the one server error
    lat, avail, fast = ledger.statuses()
    assert (lat.total, lat.bad) == (116, 2)  # the 5 cancelled are in no latency SLO
    assert lat.budget_remaining == pytest.approx(1 - (2 / 116) / 0.001)  # overspent: negative
    assert (avail.total, avail.bad) == (121, 1)
    assert avail.budget_remaining == pytest.approx(1 - (1 / 121) / 0.01)
    assert avail.attainment == pytest.approx(120 / 121)
    assert (fast.total, fast.attainment, fast.budget_remaining) == (0, None, 1.0)  # no request has a path yet
    registry = CollectorRegistry()
    registry.register(ledger)
    text = generate_latest(registry).decode()
    assert (
        f'infersight_slo_error_budget_remaining_ratio{{slo="availability"}} {avail.budget_remaining!r}'
        in text
    )
    assert 'infersight_slo_burn_rate{slo="availability",window="1h"}' in text
    assert 'infersight_slo_attainment_ratio{slo="fast-latency"}' not in text


def test_a_hung_up_request_is_in_no_latency_slo_however_long_it_ran() -> None:
    ledger = SLOLedger(parse_config(SLOS).slos, clock=Clock())
    for i in range(20):
        ledger.observe(_record(i, 5.0, error_type="cancelled"))  # the clients left after 5 s
        ledger.observe(_record(100 + i, 0.01, error_type="cancelled"))  # and after 10 ms
    lat, avail, _fast = ledger.statuses()
    assert (lat.total, lat.bad, lat.budget_remaining) == (0, 0, 1.0)  # neither slow nor fast
    assert (avail.total, avail.bad) == (40, 0)  # served as far as anyone waited: no server error


def test_ledger_forgets_requests_older_than_the_window() -> None:
    clock = Clock()
    ledger = SLOLedger(parse_config(SLOS).slos, clock=clock)
    ledger.observe(_record(1, 1.0))
    assert ledger.burn_rate("banking-latency", 300) == pytest.approx(1000.0)
    clock.advance(600)
    ledger.observe(_record(2, 0.01))
    assert ledger.burn_rate("banking-latency", 300) == 0.0
    assert ledger.counts("banking-latency", 3600) == (2, 1)
    clock.advance(31 * 86400)
    assert ledger.counts("banking-latency", 30 * 86400) == (0, 0)


def test_fast_burn_pages_through_the_same_evaluator_and_a_tolerable_rate_does_not(sqlite_db: Engine) -> None:
    config = parse_config(SLOS)
    clock = Clock()
    ledger = SLOLedger(config.slos, clock=clock)
    evaluator = Evaluator(sqlite_db, config, ledger, clock=clock)
    fired: list[tuple[str, str, float | None]] = []
    n = 0

    def minute(requests: int, slow_every: int) -> None:
        nonlocal n
        for i in range(requests):
            n += 1
            ledger.observe(_record(n, 0.5 if i % slow_every == 0 else 0.05))
        clock.advance(60)
        for t in evaluator.evaluate().transitions:
            if t.to_state == "firing":
                fired.append((t.alertname, dict(t.labels)["slo"], t.value))

    for _ in range(10):  # 1 in 120 slow: burn rate 8.3, under 14.4 (no fast page) but over 6
        minute(120, 120)
    assert ledger.burn_rate("banking-latency", 3600) == pytest.approx(1 / 120 / 0.001)
    assert sorted((a, s) for a, s, _ in fired) == [
        ("SLOBudgetTicket", "banking-latency"),
        ("SLOSlowBurn", "banking-latency"),
    ]
    for _ in range(3):  # half the requests slow: burn rate 500 over 5m
        minute(60, 2)
    assert ("SLOFastBurn", "banking-latency") in [(a, s) for a, s, _ in fired]
    assert not any(slo == "availability" for _, slo, _ in fired)


# -- Prometheus --------------------------------------------------------------------------------

_BUCKET = 'gen_ai_server_request_duration_seconds_bucket{{model="m",model_version="v1",le="{le}"}}'
_COUNT = 'gen_ai_server_request_duration_seconds_count{model="m",model_version="v1"}'


def _export(tmp_path: Path, rules: str) -> Path:
    src = tmp_path / "rules.yaml"
    src.write_text(rules)
    out = tmp_path / "infersight.rules.yml"
    assert main(["rules", "export", str(out), "--rules", str(src)]) == 0
    return out


def test_export_has_recording_rules_and_passes_promtool_check(tmp_path: Path) -> None:
    promtool = require_executable("promtool")
    out = _export(tmp_path, SLOS)
    exported = yaml.safe_load(out.read_text())
    records = [r["record"] for g in exported["groups"] for r in g["rules"] if "record" in r]
    assert (
        "infersight_slo:burn_rate:1h" in records and "infersight_slo:error_budget_remaining:ratio" in records
    )
    text = out.read_text()
    assert 'error_type!~"client_error|cancelled|ClientDisconnected|PromptTooLong|' in text
    assert "&id" not in text and "/ 0.001\n" in text  # plain YAML, the budget written as declared
    assert 'le="0.1"' in text and 'path="fast"' in text
    run = subprocess.run([promtool, "check", "rules", str(out)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    n_alerts = len(parse_config(SLOS).rules)
    assert f"SUCCESS: {len(records) + n_alerts} rules found" in run.stdout


def _burn_series(slow_per_minute: int) -> list[dict[str, str]]:
    """60 requests a minute of which `slow_per_minute` take longer than 100 ms."""
    good = 60 - slow_per_minute
    return [
        {"series": _BUCKET.format(le="0.1"), "values": f"0+{good}x600"},
        {"series": _BUCKET.format(le="+Inf"), "values": "0+60x600"},
        {"series": _COUNT, "values": "0+60x600"},
    ]


def test_promtool_unit_test_covers_a_fast_burn_and_a_slow_burn(tmp_path: Path) -> None:
    promtool = require_executable("promtool")
    rules = "groups: []\nslos:\n  - {name: lat, model: m, objective: 0.999, threshold_ms: 100, window: 30d}\n"
    out = _export(tmp_path, rules)
    config = parse_config(rules)

    def alert(name: str, burn_rate: float) -> dict[str, object]:
        rule = next(r for r in config.rules if r.name == name)
        labels = {"alertname": name, **dict(rule.labels)}
        annotations = {k: render(v, labels, burn_rate) for k, v in rule.annotations}  # infersight's rendering
        return {"exp_labels": dict(rule.labels), "exp_annotations": annotations}

    fast = {  # 30 of 60 slow: burn rate 500, pages as soon as the 5m window sees it
        "interval": "1m",
        "input_series": _burn_series(30),
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "SLOFastBurn", "exp_alerts": [alert("SLOFastBurn", 500)]},
            {"eval_time": "5m", "alertname": "SLOSlowBurn", "exp_alerts": [alert("SLOSlowBurn", 500)]},
        ],
        "promql_expr_test": [
            {
                "expr": 'round(infersight_slo:burn_rate:1h{slo="lat"})',
                "eval_time": "30m",
                "exp_samples": [{"labels": '{slo="lat"}', "value": 500}],
            }
        ],
    }
    slow_burn = 8 / 1008 / 0.001
    slow = {  # 8 of 1008 slow: burn rate 7.94, a slow page and a ticket but no fast page
        "interval": "1m",
        "input_series": [
            {"series": _BUCKET.format(le="0.1"), "values": "0+1000x600"},
            {"series": _BUCKET.format(le="+Inf"), "values": "0+1000x600"},
            {"series": _COUNT, "values": "0+1008x600"},  # 8 of 1008 slow: burn rate 7.94
        ],
        "alert_rule_test": [
            {"eval_time": "2h", "alertname": "SLOFastBurn", "exp_alerts": []},  # 7.9 < 14.4: no fast page
            {"eval_time": "2h", "alertname": "SLOSlowBurn", "exp_alerts": [alert("SLOSlowBurn", slow_burn)]},
            {
                "eval_time": "2h",
                "alertname": "SLOBudgetTicket",
                "exp_alerts": [alert("SLOBudgetTicket", slow_burn)],
            },
        ],
    }
    quiet = {  # 0.05% slow: half the budget rate, nothing fires
        "interval": "1m",
        "input_series": [
            {"series": _BUCKET.format(le="0.1"), "values": "0+1999x600"},
            {"series": _COUNT, "values": "0+2000x600"},
        ],
        "alert_rule_test": [
            {"eval_time": f"{h}h", "alertname": name, "exp_alerts": []}
            for h in (1, 6)
            for name in ("SLOFastBurn", "SLOSlowBurn", "SLOBudgetTicket")
        ],
    }
    test_file = tmp_path / "tests.yml"
    test_file.write_text(
        yaml.safe_dump({"rule_files": [str(out)], "evaluation_interval": "1m", "tests": [fast, slow, quiet]})
    )
    run = subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


_SHED = 'infersight_client_outcomes_total{model="m",model_version="v1",outcome="shed"}'
_ROUTE = 'infersight_route_request_duration_seconds_{kind}{{path="fast"{le}}}'
_ROUTE_SHED = 'infersight_route_requests_total{path="fast",reason="shed"}'


def test_promtool_unit_test_counts_shed_requests_as_misses_as_the_ledger_does(tmp_path: Path) -> None:
    """A request the length breaker shed (503) is bad for every SLO covering it: in the
    collectors' series it is in the histogram at duration 0 and in the client outcomes, in
    the routing metrics only in `infersight_route_requests_total{reason="shed"}`."""
    promtool = require_executable("promtool")
    rules = (
        "groups: []\nslos:\n"
        "  - {name: lat, model: m, objective: 0.999, threshold_ms: 100, window: 30d}\n"
        "  - {name: avail, model: m, objective: 0.99, window: 30d}\n"
        "  - {name: fast-latency, path: fast, objective: 0.999, threshold_ms: 50, window: 30d}\n"
    )
    out = _export(tmp_path, rules)
    config = parse_config(rules)
    clock = Clock()
    ledger = SLOLedger(config.slos, clock=clock)
    for i in range(60):  # one minute as the ledger sees it: 30 served in 20 ms, 30 shed
        ledger.observe(_record(i, 0.02 if i % 2 else 0.0, error_type=None if i % 2 else SHED))
    for i in range(1008):  # another model's fast path: 1000 served in 20 ms, 8 shed
        error = SHED if i < 8 else None
        record = InferenceRecord(
            f"f{i}", "routed", "v2", 1.7e9, 0.0 if error else 0.02, error_type=error, path="fast"
        )
        ledger.observe(record)
    lat_burn, avail_burn = ledger.burn_rate("lat", 3600), ledger.burn_rate("avail", 3600)
    fast_burn = ledger.burn_rate("fast-latency", 3600)
    assert (lat_burn, avail_burn) == (pytest.approx(500.0), pytest.approx(50.0))
    assert fast_burn == pytest.approx(8 / 1008 / 0.001)  # 7.9: a slow burn, no fast page

    def alert(name: str, slo: str, burn_rate: float) -> dict[str, object]:
        rule = next(r for r in config.rules if r.name == name and dict(r.labels)["slo"] == slo)
        labels = {"alertname": name, **dict(rule.labels)}
        annotations = {k: render(v, labels, burn_rate) for k, v in rule.annotations}
        return {"exp_labels": dict(rule.labels), "exp_annotations": annotations}

    shed_half = {  # every request within 100 ms, but half of them shed: burn rates 500 and 50, both page
        "interval": "1m",
        "input_series": [
            {"series": _BUCKET.format(le="0.1"), "values": "0+60x600"},  # shed ones at 0 s
            {"series": _BUCKET.format(le="+Inf"), "values": "0+60x600"},
            {"series": _COUNT, "values": "0+60x600"},
            {"series": _SHED, "values": "0+30x600"},
        ],
        "alert_rule_test": [
            {
                "eval_time": "10m",
                "alertname": "SLOFastBurn",
                "exp_alerts": [alert("SLOFastBurn", "avail", 50), alert("SLOFastBurn", "lat", 500)],
            },
        ],
        "promql_expr_test": [
            {
                "expr": f'round(infersight_slo:burn_rate:1h{{slo="{slo}"}})',
                "eval_time": "30m",
                "exp_samples": [{"labels": f'{{slo="{slo}"}}', "value": value}],
            }
            for slo, value in (("lat", 500), ("avail", 50))
        ],
    }
    fast_path = {  # the fast path: every served request within 50 ms, 8 of 1008 shed
        "interval": "1m",
        "input_series": [
            {"series": _ROUTE.format(kind="bucket", le=',le="0.05"'), "values": "0+1000x600"},
            {"series": _ROUTE.format(kind="bucket", le=',le="+Inf"'), "values": "0+1000x600"},
            {"series": _ROUTE.format(kind="count", le=""), "values": "0+1000x600"},
            {"series": _ROUTE_SHED, "values": "0+8x600"},
        ],
        "alert_rule_test": [
            {"eval_time": "2h", "alertname": "SLOFastBurn", "exp_alerts": []},
            {
                "eval_time": "2h",
                "alertname": "SLOSlowBurn",
                "exp_alerts": [alert("SLOSlowBurn", "fast-latency", fast_burn)],
            },
        ],
        "promql_expr_test": [
            {
                "expr": 'round(100 * infersight_slo:burn_rate:1h{slo="fast-latency"})',
                "eval_time": "2h",
                "exp_samples": [{"labels": '{slo="fast-latency"}', "value": round(100 * fast_burn)}],
            },
        ],
    }
    test_file = tmp_path / "tests.yml"
    test_file.write_text(
        yaml.safe_dump(
            {"rule_files": [str(out)], "evaluation_interval": "1m", "tests": [shed_half, fast_path]}
        )
    )
    run = subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout
