"""The slowdown checklist runs itself: a flood of long prompts drops served tokens/s
against the same hour yesterday, the default ThroughputDrop rule fires, and its diagnose
action ranks "request distribution" first, in the alert's annotations, its snapshot and
`GET /api/v1/alerts/{id}/diagnosis`; a changed torch version names itself; a start on
changed versions raises DependencyChanged."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from _service_support import auth, config, running
from infersight.alerts import ActionRunner, CompositeSignals, Evaluator, StoreSignals
from infersight.alerts.rules.config import load_config
from infersight.alerts.rules.signals import StaticSignals
from infersight.monitor.business import diagnose, record_environment
from infersight.monitor.service.wiring_business import BusinessWiring
from infersight.monitor.store.tables import alerts, requests, snapshots
from sqlalchemy import Engine, insert, select

T0 = 1_800_000_000.0
DAY = 86_400.0
VERSIONS = {"python": "3.11.7", "infersight": "0.1.0", "torch": "2.3.0", "cuda_runtime": "12.1"}


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _at(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, dt.UTC)


def _traffic(db: Engine, start: float, *, n: int, span_s: float, long_share: float, tag: str) -> None:
    """`n` requests over `span_s` seconds; a `long_share` of them with 6,000-token prompts
    that leave room for few output tokens (the flood). Like prompts decode alike (TPOT)."""
    rows = []
    for i in range(n):
        long = (i % 100) < long_share * 100
        rows.append({
            "request_id": f"{tag}-{i}", "model": "m", "model_version": "v1", "source": "engine",
            "started_at": _at(start + i * span_s / n), "duration_s": 3.0 if long else 1.2,
            "ttft_s": 0.9 if long else 0.2, "tpot_s": 0.02 if long else 0.005, "queue_s": 0.01,
            "prompt_tokens": 6000 + i % 50 if long else 150 + i % 100, "output_tokens": 40 if long else 200,
        })  # fmt: skip
    with db.begin() as conn:
        conn.execute(insert(requests), rows)


def test_a_long_prompt_flood_fires_throughput_drop_with_request_distribution_ranked_first(tmp_path: Any) -> None:
    clock = Clock()
    with running(config(tmp_path), clock=clock) as (app, client):
        db = app.state.service.db
        _traffic(db, T0 - DAY - 600, n=1200, span_s=1200, long_share=0.0, tag="yesterday")
        _traffic(db, T0 - 600, n=1200, span_s=1200, long_share=0.5, tag="today")
        business = BusinessWiring(db, clock=clock, feedback_ttl_s=DAY, long_prompt_tokens=2048,
                                  environment=lambda: VERSIONS)  # fmt: skip
        signals = CompositeSignals(StaticSignals(), throughput_drop=StoreSignals(db, clock=clock))
        evaluator = Evaluator(db, load_config(None), signals, clock=clock)
        runner = ActionRunner(db, data_dir=tmp_path / "data", clock=clock, diagnoser=business)
        evaluator.evaluate()  # pending
        clock.t += 310
        result = evaluator.evaluate()
        assert [(t.alertname, t.to_state) for t in result.transitions] == [("ThroughputDrop", "firing")]
        outcomes = runner.run_pending()
        assert [(o.action, o.state) for o in outcomes] == [("diagnose", "succeeded"), ("snapshot", "succeeded")]
        diagnosis = outcomes[0].detail["diagnosis"]
        ranked = [c["name"] for c in diagnosis["checks"]]
        assert ranked[0] == "request distribution", diagnosis
        first = diagnosis["checks"][0]
        assert first["verdict"] == "suspect" and "50% of prompts over 2048 tokens (before 0%)" in first["figure"]
        kernel = next(c for c in diagnosis["checks"] if c["name"] == "kernel/step time")
        assert kernel["verdict"] == "clear"  # like prompts decode as fast as yesterday
        with db.connect() as conn:
            alert = conn.execute(select(alerts).where(alerts.c.alertname == "ThroughputDrop")).one()
            snap = conn.execute(select(snapshots.c.content)).scalar_one()
        annotations = json.loads(alert.annotations)
        assert annotations["diagnosis"].startswith("checklist, most likely first: request distribution")
        assert json.loads(snap)["diagnosis"]["checks"][0]["name"] == "request distribution"
        served = client.get(f"/api/v1/alerts/{alert.fingerprint}/diagnosis", headers=auth()).json()
        assert served["ran"] == "with the alert" and served["checks"][0]["name"] == "request distribution"
        assert client.get("/api/v1/alerts/0000/diagnosis").status_code == 404
        spec = load_config(None).rule("ThroughputDrop").actions[0]
        again = [runner.run(spec, alertname="Other", labels={"model_version": "v1"}) for _ in range(4)]
        assert [o.state for o in again] == ["succeeded"] * 4  # no cooldown or cap on a read-only checklist


def test_no_drop_while_demand_is_lower(tmp_path: Any) -> None:
    clock = Clock()
    with running(config(tmp_path), clock=clock) as (app, _client):
        db = app.state.service.db
        _traffic(db, T0 - DAY - 600, n=1200, span_s=1200, long_share=0.0, tag="yesterday")
        _traffic(db, T0 - 600, n=300, span_s=1200, long_share=0.0, tag="today")  # a quiet hour
        signal = load_config(None).rule("ThroughputDrop").condition.signal
        assert StoreSignals(db, clock=clock).read(signal, ("model", "model_version")) == []


def test_a_changed_torch_version_names_itself_and_a_start_on_it_raises_dependency_changed(tmp_path: Any) -> None:
    clock = Clock(T0 - DAY - 3600)
    with running(config(tmp_path), clock=clock) as (app, client):
        db = app.state.service.db
        current = dict(VERSIONS)
        business = BusinessWiring(db, clock=clock, feedback_ttl_s=DAY, long_prompt_tokens=2048,
                                  environment=lambda: current)  # fmt: skip
        business.record_environment("start")  # yesterday's good start
        _traffic(db, T0 - DAY - 600, n=600, span_s=600, long_share=0.0, tag="yesterday")
        clock.t = T0 - 1800
        current["torch"] = "2.4.0"  # torch updated itself before this start
        _, changed = business.record_environment("start")
        assert changed == {"torch": ("2.3.0", "2.4.0")}
        _traffic(db, T0 - 600, n=600, span_s=600, long_share=0.0, tag="today")
        found = diagnose(db, now=_at(T0), window_s=600, model_version="v1")
        deps = next(c for c in found.checks if c.name == "dependency versions")
        assert deps.verdict == "suspect" and "torch 2.3.0 -> 2.4.0" in deps.figure
        assert found.checks[0].name == "dependency versions"  # nothing else changed
        with db.connect() as conn:
            pushed = conn.execute(select(alerts).where(alerts.c.alertname == "DependencyChanged")).one()
        assert "torch 2.3.0 -> 2.4.0" in json.loads(pushed.annotations)["summary"]
        assert json.loads(pushed.labels)["severity"] == "info"
        env = client.get("/api/v1/environment").json()
        assert env["current"]["versions"]["torch"] == "2.4.0"
        assert [h["versions"]["torch"] for h in env["history"][:2]] == ["2.4.0", "2.3.0"]
        record_environment(db, current, reason="deploy", now=_at(T0))  # an unchanged deploy
        assert diagnose(db, now=_at(T0 + 1), window_s=600).checks  # still runs


def test_the_environment_is_read_from_package_metadata_without_importing_torch() -> None:
    import platform
    import subprocess
    import sys

    code = ("import sys; from infersight.monitor.business import current_environment as c; "
            "v = c(engine_native=lambda: 'x86-64-v3'); print(v['python'], v['engine_native'], 'torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [platform.python_version(), "x86-64-v3", "False"]


def test_a_growing_gpu_memory_is_a_suspected_leak_ranked_first(tmp_path: Any) -> None:
    with running(config(tmp_path)) as (app, _client):
        db = app.state.service.db
        _traffic(db, T0 - DAY - 600, n=600, span_s=600, long_share=0.0, tag="yesterday")
        _traffic(db, T0 - 600, n=600, span_s=600, long_share=0.0, tag="today")
        t = [T0 - 600 + 30 * i for i in range(20)]
        readings = {"t": t, "series": {"gpu_memory_used_bytes": [8 * 2**30 + 200 * 2**20 * i / 2 for i in range(20)],
                                       "process_rss_bytes": [2**30] * 20}}  # fmt: skip
        found = diagnose(db, now=_at(T0), window_s=600, readings=readings)
        assert found.checks[0].name == "memory" and found.checks[0].verdict == "suspect"
        assert "leak suspected: gpu +200.0 MiB/min" in found.checks[0].figure


def test_a_deploy_on_changed_versions_is_recorded_and_raises_dependency_changed(tmp_path: Any) -> None:
    clock = Clock()
    with running(config(tmp_path), clock=clock) as (app, _client):
        db = app.state.service.db
        current = dict(VERSIONS)
        business = BusinessWiring(db, clock=clock, feedback_ttl_s=DAY, long_prompt_tokens=2048,
                                  environment=lambda: current)  # fmt: skip
        business.record_environment("start")

        class VersionDeployed:  # the runtime's event, by its name (the engine is not imported)
            pass

        current["transformers"] = "4.45.0"
        clock.t += 60
        business.on_deploy_event(VersionDeployed())
        with db.connect() as conn:
            pushed = conn.execute(select(alerts).where(alerts.c.alertname == "DependencyChanged")).all()
        summaries = [json.loads(p.annotations)["summary"] for p in pushed]
        assert any("this deploy runs on changed versions: transformers None -> 4.45.0" in s for s in summaries)
