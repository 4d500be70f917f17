"""The Grafana dashboard against a real Prometheus (Debian's package) scraping the demo.

The demo (`infersight demo --fast`: baseline traffic, a topic shift, a bad release that the
post-deploy analysis rolls back) runs with a Prometheus scraping its /metrics every second.
Then every query of the dashboard runs as Grafana would run it (variables at "All",
`$__rate_interval` at Grafana's default of four scrape intervals, range queries over the
demo's time, instant queries where the panel says so) and must return data. GPU panels are
exempt on a machine without a GPU (the collector is then off, and says so).
"""

from __future__ import annotations

import io
import re
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _demo_registry import shared_demo_registry
from _prometheus_support import prometheus_server, query, query_range, wait_for_prometheus
from conftest import free_port
from infersight.dashboards import build_dashboard, metric_names
from infersight.monitor.service.demo import DemoOptions, run_demo

GOOD = "mixtral_banking_fp32-v1.0"
BAD = "mixtral_banking_fp32-v1.1"
_VARIABLES = {
    "$__rate_interval": "1m",
    "$model_version": ".*",
    "$model": ".*",
    "$instance": ".*",
    "$gpu": ".*",
}


def _grafana(expr: str) -> str:
    """The expression as Grafana sends it with every variable at "All"."""
    for name, value in _VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


class Demo:
    def __init__(self, base: str, start: float, end: float, text: str) -> None:
        self.base, self.start, self.end, self.text = base, start, end, text

    def range(self, expr: str) -> list[dict[str, Any]]:
        return query_range(self.base, _grafana(expr), self.start, self.end, 2)

    def instant(self, expr: str) -> list[dict[str, Any]]:
        return query(self.base, _grafana(expr), at=self.end)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    tmp = tmp_path_factory.mktemp("demo-prometheus")
    shutil.copytree(shared_demo_registry(tmp_path_factory), tmp / "registry", symlinks=True)
    port = free_port()
    with prometheus_server(tmp, [port]) as base:
        wait_for_prometheus("Prometheus ready", lambda: query(base, "vector(1)"))
        out = io.StringIO()
        start = time.time()
        result = run_demo(DemoOptions(data_dir=tmp, fast=True, port=port, linger_s=3.0), out)
        assert result.ok, out.getvalue()
        # the demo stops its service on return: the range ends at the last scrape that found it up
        (up,) = query_range(base, "up", start, time.time(), 1)
        end = max(float(t) for t, v in up["values"] if v == "1")
        yield Demo(base, start, end, out.getvalue())


def _queries() -> list[tuple[str, dict[str, Any]]]:
    dash = build_dashboard()
    return [(p["title"], t) for p in dash["panels"] for t in p.get("targets", [])]


def _is_gpu(expr: str) -> bool:
    names = metric_names(expr)
    return bool(names) and all(
        n.startswith(("infersight_gpu_", "infersight_nvml_")) and n != "infersight_gpu_collector_enabled"
        for n in names
    )


def _is_routing(expr: str) -> bool:
    """A panel of the "SLA routing" row: data only where `routing:` is configured (not the demo)."""
    names = metric_names(expr)
    return bool(names) and (all(n.startswith("infersight_route_") for n in names) or 'path!=""' in expr)


def _is_satisfaction(expr: str) -> bool:
    """A panel of the "Satisfaction" row: data only where users' feedback arrived (not the demo)."""
    names = metric_names(expr)
    return bool(names) and all(n.startswith("infersight_satisfaction_") for n in names)


def test_every_panel_query_returns_data_after_the_demo(demo: Demo) -> None:
    gpu_on = any(float(s["value"][1]) for s in demo.instant("max(infersight_gpu_collector_enabled)"))
    routing_on = bool(demo.instant("max(infersight_route_sla_seconds)"))
    rated = bool(demo.instant("max(infersight_satisfaction_rated_requests) > 0"))
    empty, checked = [], 0
    for title, target in _queries():
        if (_is_gpu(target["expr"]) and not gpu_on) or (_is_routing(target["expr"]) and not routing_on):
            continue
        if _is_satisfaction(target["expr"]) and not rated:
            continue
        series = demo.instant(target["expr"]) if target.get("instant") else demo.range(target["expr"])
        checked += 1
        if not series:
            empty.append(f"{title}: {target['expr']}")
    assert checked >= 30
    assert not empty, "panel queries with no data:\n" + "\n".join(empty)
    for annotation in build_dashboard()["annotations"]["list"]:
        if "expr" in annotation:  # parses (Prometheus answers 400 otherwise, raised here)
            demo.range(annotation["expr"])


def test_serving_version_is_an_instant_query_showing_the_version_the_demo_ended_on(demo: Demo) -> None:
    (panel,) = [p for p in build_dashboard()["panels"] if p["title"] == "Serving version"]
    (target,) = panel["targets"]
    assert target["instant"] is True and target["range"] is False
    series = demo.instant(target["expr"])
    # the demo ends with its next release's canary decided: promoted (then it serves) or
    # rolled back to GOOD; never the rolled-back BAD, and exactly one version
    promoted = re.search(r"(mixtral_banking_\w+-v1\.2)\b.*promoted to every user", demo.text)
    assert [s["metric"]["model_version"] for s in series] == [promoted.group(1) if promoted else GOOD]


def test_the_rollback_appears_in_the_deploys_panel_and_annotation(demo: Demo) -> None:
    dash = build_dashboard()
    (annotation,) = [a for a in dash["annotations"]["list"] if a.get("name") == "Deploys and rollbacks"]
    for expr in [annotation["expr"]] + [
        t["expr"] for title, t in _queries() if "infersight_deploys_total" in t["expr"]
    ]:
        outcomes = {
            s["metric"].get("outcome") for s in demo.range(expr) if any(float(v) > 0 for _, v in s["values"])
        }
        assert {"deployed", "rolled_back"} <= outcomes, (expr, outcomes)


def test_the_error_ratio_reads_zero_without_errors(demo: Demo) -> None:
    (panel,) = [p for p in build_dashboard()["panels"] if p["title"] == "Error ratio"]
    (target,) = panel["targets"]
    series = demo.range(target["expr"])
    assert series and all(float(v) >= 0 for s in series for _, v in s["values"])
    assert re.search(r"\bor\b", target["expr"])  # no errors at all is a 0, not "No data"


def test_gpu_panels_group_by_instance() -> None:
    dash = build_dashboard()
    names = [v["name"] for v in dash["templating"]["list"]]
    assert "instance" in names
    for title, target in _queries():
        if _is_gpu(target["expr"]):
            assert 'instance=~"$instance"' in target["expr"], title
            assert "{{instance}}" in target["legendFormat"], title
