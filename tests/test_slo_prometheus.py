"""A real Prometheus (Debian's package) scrapes the collectors' histograms, the SLO ledger and
the cost meter, and runs the rules `infersight rules export` writes: its recorded burn rate and
error budget agree with the in-process ledger's, and the Grafana "SLOs and cost" panels'
queries return the series they draw."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from _prometheus_support import prometheus_server, query, wait_for_prometheus
from infersight.alerts import SLOLedger, export_prometheus
from infersight.alerts.rules.config import parse_config
from infersight.collectors import InferenceStats, serve_metrics
from infersight.dashboards import build_dashboard
from infersight.monitor.records import InferenceRecord
from infersight.monitor.service.metrics import CostMeter
from prometheus_client import CollectorRegistry

from tests.conftest import free_port

RULES = """
groups: []
slos:
  - {name: lat, model: m, objective: 0.99, threshold_ms: 100, window: 30d}
  - {name: avail, objective: 0.99, window: 30d}
"""


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    target = free_port()
    exported = yaml.safe_load(export_prometheus(parse_config(RULES)).text)
    for group in exported["groups"]:  # the expressions as exported; evaluated every second for the test
        group["interval"] = "1s"
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(exported))
    with prometheus_server(tmp_path, [target], rule_files=[rules]) as base:
        yield base, target


def test_prometheus_burn_rate_and_budget_agree_with_the_ledger(prometheus: tuple[str, int]) -> None:
    base, target = prometheus
    registry = CollectorRegistry()
    stats = InferenceStats(registry)
    ledger = SLOLedger(parse_config(RULES).slos)
    cost = CostMeter(4.10)
    registry.register(ledger)
    registry.register(cost)
    # Prometheus sees a counter's increase only from its first scrape: one server error and one
    # client error before it, so the error series exist when the measured requests arrive (the
    # ledger counts only those measured requests, as Prometheus' rate does)
    for i, error in enumerate(("RuntimeError", "client_error")):
        stats.observe(
            InferenceRecord(f"w{i}", "m", "v1", time.time(), 0.02, output_tokens=1, error_type=error)
        )
    server = serve_metrics(registry, port=target)
    try:
        count = 'sum(gen_ai_server_request_duration_seconds_count{model="m"})'
        wait_for_prometheus("the first scrape (series at zero)", lambda: query(base, count))
        records = []
        # 1 in 50 over 100 ms (burn rate 2 against a 1% budget), 1 in 100 a server error
        for i in range(4000):
            error = "RuntimeError" if i % 100 == 7 else ("client_error" if i % 100 == 8 else None)
            records.append(
                InferenceRecord(f"r{i}", "m", "v1", time.time(), 0.25 if i % 50 == 0 else 0.02,
                                output_tokens=30, error_type=error)
            )  # fmt: skip
        for r in records:
            stats.observe(r)
            ledger.observe(r)
            cost.observe(r)
        wait_for_prometheus("a scrape with every request",
                  lambda: [r for r in query(base, count) if float(r["value"][1]) == 2 + len(records)])  # fmt: skip
        lat, avail = ledger.statuses()
        assert lat.budget_remaining == pytest.approx(1 - (80 / 4000) / 0.01)  # -1: overspent twice over
        assert avail.budget_remaining == pytest.approx(1 - (40 / 4000) / 0.01)  # 0: spent exactly

        def recorded(promql: str) -> float | None:
            result = query(base, promql)
            return float(result[0]["value"][1]) if result else None

        # rate() extrapolates each series toward its start by at most (its first value / its
        # increase) of the sampled span: 2/4000 for the histogram, 1/40 for the error counter;
        # so Prometheus' burn rates differ from the exact counts by at most that much
        wait_for_prometheus(
            "the recording rules over the full scrape",
            lambda: recorded('infersight_slo:burn_rate:1h{slo="lat"}') == pytest.approx(2.0, rel=0.01),
        )
        for slo, status in (("lat", lat), ("avail", avail)):
            budget = recorded(f'infersight_slo:error_budget_remaining:ratio{{slo="{slo}"}}')
            assert budget == pytest.approx(status.budget_remaining, abs=0.03), slo  # 1/40 of burn rate 1
            attainment = recorded(f'infersight_slo:attainment:ratio{{slo="{slo}"}}')
            assert attainment == pytest.approx(status.attainment, abs=0.03 * 0.01), slo

        dashboard = build_dashboard()
        panels = [p for p in dashboard["panels"] if p["title"] in (
            "Error budget remaining", "SLO attainment", "SLO burn rate", "Cost per 1k output tokens")]  # fmt: skip
        assert len(panels) == 4
        for panel in panels:
            expr = panel["targets"][0]["expr"]
            for variable in ("$model_version", "$model", "$instance"):  # Grafana's "All"
                expr = expr.replace(variable, ".*")
            assert query(base, expr), f"{panel['title']}: {expr} returns nothing"
        [per_1k] = query(base, "infersight_cost_per_1k_output_tokens")
        assert per_1k["metric"]["model_version"] == "v1" and float(per_1k["value"][1]) > 0
    finally:
        server.close()
