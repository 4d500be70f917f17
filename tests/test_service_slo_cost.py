"""SLOs and cost through the service: the error budget and cost per 1k output tokens of
ingested traffic on /metrics and on the page's overview; a bad `cost:` is refused with its key."""

from __future__ import annotations

from pathlib import Path

import pytest
from _service_support import auth, config, event, running, wait_for
from infersight.monitor.records import InferenceRecord
from infersight.monitor.service import ConfigInvalid, load_config
from infersight.monitor.service.config import AlertingConfig, CostConfig
from infersight.monitor.service.metrics import CostMeter

RULES = """
groups: []
slos:
  - {name: banking-latency, model_version: mixtral_banking_fp32-v1.0, objective: 0.99, threshold_ms: 100, window: 30d}
  - {name: availability, objective: 0.99, window: 30d}
"""


def test_ingested_traffic_spends_the_budget_shown_on_metrics_and_overview(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    cfg = config(tmp_path, alerting=AlertingConfig(rules=rules), cost=CostConfig(per_hour=4.10))
    with running(cfg) as (_app, client):
        # 100 requests: 98 fast, 2 slow (0.25 s); one client error that spends no availability budget
        events = [event(i, duration_s=0.25 if i < 2 else 0.05, output_tokens=50) for i in range(100)]
        events.append(event(100, duration_s=0.01, error_type="client_error", output_tokens=0))
        assert (
            client.post("/api/v1/events", json={"events": events}, headers=auth()).json()["accepted"] == 101
        )
        slos = wait_for(
            lambda: [s for s in client.get("/api/v1/overview").json()["slos"] if s["total"] == 101]
        )
        lat, avail = slos
        assert (lat["name"], lat["bad"], lat["window"]) == ("banking-latency", 2, "30d")
        assert lat["error_budget_remaining"] == pytest.approx(1 - (2 / 101) / 0.01)
        assert (avail["bad"], avail["error_budget_remaining"]) == (0, 1.0)
        overview = client.get("/api/v1/overview").json()
        [cost] = overview["cost"]
        assert (cost["model_version"], cost["output_tokens"]) == ("mixtral_banking_fp32-v1.0", 5000)
        assert cost["per_1k_output_tokens"] > 0 and overview["cost_per_hour"] == 4.10
        text = client.get("/metrics").text
        assert 'infersight_slo_error_budget_remaining_ratio{slo="availability"} 1.0' in text
        assert 'infersight_slo_attainment_ratio{slo="banking-latency"}' in text
        assert (
            'infersight_cost_per_1k_output_tokens{model="mixtral_banking",model_version="mixtral_banking_fp32-v1.0"}'
            in text
        )


def _record(version: str, duration_s: float, tokens: int) -> InferenceRecord:
    return InferenceRecord("r", "m", version, 1.7e9, duration_s, output_tokens=tokens)


def test_cost_is_shared_by_busy_time_and_divided_by_output_tokens() -> None:
    now = [1000.0]
    meter = CostMeter(3.6, window_s=3600.0, clock=lambda: now[0])  # 0.001 per second
    now[0] += 1000.0  # the window so far: 1000 s, cost 1.0
    for _ in range(10):
        meter.observe(_record("fp32", 0.3, 100))  # 3 busy seconds, 1000 tokens
        meter.observe(_record("int8", 0.1, 100))  # 1 busy second, 1000 tokens
    costs = {c.model_version: c for c in meter.costs()}
    assert costs["fp32"].cost == pytest.approx(0.75) and costs["int8"].cost == pytest.approx(0.25)
    assert costs["fp32"].per_1k_output_tokens == pytest.approx(0.75)
    assert costs["int8"].per_1k_output_tokens == pytest.approx(0.25)  # the faster build is 3x cheaper
    devices = CostMeter(3.6, devices=lambda: 4, clock=lambda: now[0])
    now[0] += 1000.0
    devices.observe(_record("fp32", 1.0, 1000))
    assert devices.costs()[0].per_1k_output_tokens == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("cost: {per_hour: 0}", "cost.per_hour"),
        ("cost: {per_hour: -1.5}", "cost.per_hour"),
        ("cost: {per_hour: 4.1, per: gpu}", "cost.per"),
        ("cost: {per_hour: 4.1, currency: eur}", "cost.currency"),
        ("cost: {per: device}", "cost"),
    ],
)
def test_a_bad_cost_is_refused_with_its_key(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "infersight.yaml"
    path.write_text(text)
    with pytest.raises(ConfigInvalid) as info:
        load_config(path, {})
    assert str(info.value).startswith(f"{path}: {field}")


def test_embedded_runtime_requests_spend_the_budget_and_carry_a_cost(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from _demo_registry import GOOD, private_copy, shared_demo_registry
    from infersight.monitor.service import EngineConfig

    tmp = tmp_path_factory.mktemp("engine-slo")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    rules = tmp / "rules.yaml"
    rules.write_text(
        "groups: []\nslos:\n  - {name: availability, objective: 0.99, window: 30d}\n"
        "  - {name: engine-latency, model_version: "
        + GOOD
        + ", objective: 0.9, threshold_ms: 600000, window: 1d}\n"
    )
    cfg = config(
        tmp,
        engine=EngineConfig(
            registry=registry, version=GOOD, max_batch_size=4, max_seq_len=512, max_tokens_limit=64
        ),
        alerting=AlertingConfig(rules=rules),
        cost=CostConfig(per_hour=4.10),
    )
    with running(cfg) as (_app, client):
        for prompt in ("how do i top up my card", "my card was declined", "where is my refund"):
            body = {"model": GOOD, "prompt": prompt, "max_tokens": 8, "temperature": 0}
            assert client.post("/v1/completions", json=body).status_code == 200
        overview = wait_for(
            lambda: (o := client.get("/api/v1/overview").json())["slos"][0]["total"] == 3 and o
        )
        avail, latency = overview["slos"]
        assert (avail["bad"], avail["error_budget_remaining"]) == (0, 1.0)
        assert (latency["total"], latency["bad"], latency["attainment"]) == (
            3,
            0,
            1.0,
        )  # none took 10 minutes
        [cost] = overview["cost"]
        assert cost["model_version"] == GOOD and 3 <= cost["output_tokens"] <= 24
        assert cost["per_1k_output_tokens"] > 0


def test_cost_series_share_the_live_statistics_label_cap() -> None:
    from infersight.collectors import InferenceStats

    stats = InferenceStats(None, max_label_values=2)
    meter = CostMeter(1.0, label_set=stats.label_set)
    for i in range(5):
        meter.observe(_record(f"v{i}", 0.1, 10))
    assert sorted(c.model_version for c in meter.costs()) == ["other", "v0", "v1"]
