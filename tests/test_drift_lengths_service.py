"""Request lengths and the scheduled drift path in the service: every request's token counts
reach the report (not only the sampled texts), the drift job evaluates new traffic without
anyone calling the API, a length_drift rule fires on long prompts, and a version that stops
receiving requests has its drift alert resolved."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from _drift_helpers import real_embedder
from _service_support import auth, config, event, running, wait_for
from infersight.alerts.errors import RuleParseError
from infersight.alerts.rules.config import load_config as load_alert_config
from infersight.alerts.rules.config import signal_promql
from infersight.alerts.rules.signals import Signal
from infersight.monitor.data import banking77, hotels
from infersight.monitor.drift import DetectorConfig, DriftDetector, RequestLengths
from infersight.monitor.service import Service
from infersight.monitor.service.config import AlertingConfig, DriftConfig, ScheduleConfig
from infersight.monitor.store.tables import requests
from sqlalchemy import func, select

V1, V2 = "mixtral_banking_fp32-v1.0", "mixtral_banking_fp32-v1.1"

RULES = """
groups:
  - name: quality
    interval: 1s
    rules:
      - alert: PromptDrift
        signal: {kind: drift_p_value, field: prompt}
        op: "<"
        threshold: 0.01
        by: [model, model_version]
        annotations: {summary: "prompts drifted"}
      - alert: LongPrompts
        signal: {kind: length_drift, field: prompt}
        op: "<"
        threshold: 0.01
        by: [model, model_version]
        annotations: {summary: "prompt lengths changed"}
"""


def _reference(tmp_path: Path) -> Path:
    """200 Banking77 questions with the token counts a server recorded for them."""
    bank = [u.text for u in banking77("train")][:200]
    path = tmp_path / "reference.jsonl"
    path.write_text(
        "".join(
            json.dumps({"prompt": t, "prompt_tokens": 30 + i % 17, "output_tokens": 20 + i % 9}) + "\n"
            for i, t in enumerate(bank)
        ),
        encoding="utf-8",
    )
    return path


def _service(tmp_path: Path, *, stale_after_s: float | None = None) -> Any:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    cfg = config(
        tmp_path,
        drift=DriftConfig(reference=_reference(tmp_path), alpha=0.01, window=100, min_window=20,
                          stale_after_s=stale_after_s),
        schedule=ScheduleConfig(drift_s=0.5, embed_s=3600.0, rules_s=0.2, timeseries_s=0.5),
        alerting=AlertingConfig(rules=rules),
    )  # fmt: skip
    service = Service(cfg)
    service.parts.drift_detector = DriftDetector(real_embedder(), DetectorConfig(alpha=0.01))
    return running(cfg, service=service)


def _send(client: Any, events: list[dict[str, Any]]) -> None:
    r = client.post("/api/v1/events", json={"events": events}, headers=auth())
    assert r.json()["accepted"] == len(events), r.text


def _reports(client: Any, version: str) -> list[dict[str, Any]]:
    return list(client.get("/api/v1/drift", params={"model_version": version}).json()["reports"])


def test_scheduled_job_reports_every_requests_lengths_without_the_api_and_flags_long_prompts(
    tmp_path: Path,
) -> None:
    bank = [u.text for u in banking77("test")]
    with _service(tmp_path) as (app, client):
        # 30 sampled texts (under half a window: only the pause triggers a verdict) among 300 requests,
        # a fifth of them with pasted documents of 2000 tokens
        events = [
            event(
                i,
                prompt=bank[i] if i % 10 == 0 else None,
                prompt_tokens=2000 if i % 5 == 1 else 30 + i % 17,
                output_tokens=20 + i % 9,
            )
            for i in range(300)
        ]
        _send(client, events)
        reports = wait_for(lambda: _reports(client, V1), timeout=60)
        assert reports[0]["n_current"] == 30 and reports[0]["length_drift"] is True
        full = client.get(f"/api/v1/drift/{reports[0]['id']}", headers=auth()).json()
        lengths = full["lengths"]
        assert lengths["counted_by"] == "tokens" and lengths["decided_by"] == "prompt length_tail"
        current = {s["field"]: s["n"] for s in lengths["summaries"] if s["window"] == "current"}
        assert current == {"prompt": 300, "output": 300}  # every request, not only the 30 sampled
        with app.state.service.db.connect() as conn:
            kept = conn.execute(
                select(func.count()).select_from(requests).where(requests.c.prompt_tokens.is_not(None))
            ).scalar()
        assert kept == 300
        firing = wait_for(
            lambda: [a for a in client.get("/api/v1/alerts?state=firing").json()["alerts"]
                     if a["alertname"] == "LongPrompts"],
            timeout=20,
        )  # fmt: skip
        assert firing[0]["labels"]["model_version"] == V1 and firing[0]["value"] < 0.01
        assert 'infersight_length_drift_p_value{field="prompt"' in client.get("/metrics").text


def test_drift_alert_of_a_version_that_stops_receiving_requests_resolves(tmp_path: Path) -> None:
    bank = [u.text for u in banking77("test")]
    hotel = [u.text for u in hotels()]
    with _service(tmp_path, stale_after_s=8.0) as (app, client):
        mixed = [t for pair in zip(bank[:40], hotel[:40], strict=True) for t in pair]
        _send(client, [event(i, model_version=V2, prompt=t) for i, t in enumerate(mixed)])
        firing = wait_for(
            lambda: [a for a in client.get("/api/v1/alerts?state=firing").json()["alerts"]
                     if a["alertname"] == "PromptDrift" and a["labels"]["model_version"] == V2],
            timeout=60,
        )  # fmt: skip
        assert firing
        # V2 is rolled back: no request reaches it any more; V1 keeps serving
        _send(client, [event(1000 + i, model_version=V1, prompt=t) for i, t in enumerate(bank[100:130])])
        wiring = app.state.service.parts.drift
        wait_for(lambda: ("mixtral_banking", V2) not in wiring.drift_p_values("prompt"), timeout=30)
        resolved = wait_for(
            lambda: [a for a in client.get("/api/v1/alerts?state=resolved").json()["alerts"]
                     if a["alertname"] == "PromptDrift" and a["labels"]["model_version"] == V2],
            timeout=20,
        )  # fmt: skip
        assert resolved
        assert (
            f'model_version="{V2}"' not in client.get("/metrics").text.split("infersight_drift_p_value", 1)[1]
        )


def test_length_drift_rules_take_prompt_or_output_and_export_to_promql(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES.replace("length_drift, field: prompt", "length_drift, field: output"))
    rule = load_alert_config(path, env={}).rule("LongPrompts")
    assert rule.condition.signal == Signal("length_drift", field="output")
    assert signal_promql(rule.condition.signal, ("model_version",)) == (
        'min by (model_version) (infersight_length_drift_p_value{field="output"})'
    )
    path.write_text(RULES.replace("length_drift, field: prompt", "length_drift, field: response"))
    with pytest.raises(RuleParseError, match="field must be one of prompt, output"):
        load_alert_config(path, env={})


def test_drift_stale_after_must_be_positive(tmp_path: Path) -> None:
    from infersight.monitor.service.config import load_config
    from infersight.monitor.service.errors import ConfigInvalid

    path = tmp_path / "infersight.yaml"
    path.write_text("drift:\n  stale_after_s: 0\n")
    with pytest.raises(ConfigInvalid, match=r"drift\.stale_after_s"):
        load_config(path, env={})
    path.write_text("drift:\n  stale_after_s: null\n")
    assert load_config(path, env={}).drift.stale_after_s is None
    assert dataclasses.replace(DriftConfig()).stale_after_s == 1800.0


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    from _store_helpers import database_url
    from infersight.monitor.store import connect, upgrade

    e = connect(database_url(request, tmp_path))
    upgrade(e)
    yield e
    e.dispose()


def test_a_reference_keeps_the_token_lengths_of_every_request_of_its_span(engine: Any) -> None:
    import datetime as dt

    from _store_helpers import request_row
    from infersight.monitor.drift import TextWindow, load_reference, save_reference
    from infersight.monitor.drift._references import traffic_lengths
    from sqlalchemy import insert

    t0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)
    rows = [
        request_row(i, at=t0 + dt.timedelta(seconds=i), prompt=None if i % 4 else f"q{i}", response=None,
                    prompt_tokens=10 + i, output_tokens=None if i == 3 else 5)
        for i in range(40)
    ]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(requests), rows)
    lengths = traffic_lengths(engine, model_version=V1, since=t0, until=t0 + dt.timedelta(minutes=1))
    assert sorted(lengths.prompt_tokens.tolist()) == list(range(10, 50))  # all 40, not the 10 sampled
    assert lengths.output_tokens.size == 39 and lengths.counted_by == "tokens"
    window = TextWindow.of([f"q{i}" for i in range(0, 40, 4)])
    save_reference(engine, "baseline", window, model_version=V1, source="deploy", lengths=lengths)
    stored = load_reference(engine, "baseline")
    assert stored.lengths is not None
    assert sorted(stored.lengths.prompt_tokens.tolist()) == list(range(10, 50))
    assert stored.lengths.output_tokens.size == 39
    # word counts are not token counts: nothing is stored, the service counts words on both sides
    save_reference(
        engine,
        "words",
        window,
        model_version=V1,
        source="file",
        lengths=RequestLengths.of_texts(window.prompts),
    )
    assert load_reference(engine, "words").lengths is None


def test_a_hung_up_request_gives_its_prompt_length_but_not_its_cut_short_answer(engine: Any) -> None:
    import datetime as dt

    from _store_helpers import request_row
    from infersight.monitor.drift._references import traffic_lengths
    from sqlalchemy import insert

    t0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)
    rows = [
        request_row(i, at=t0 + dt.timedelta(seconds=i), prompt_tokens=10 + i, output_tokens=2 if i % 2 else 40,
                    error_type="cancelled" if i % 2 else None)
        for i in range(20)
    ]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(requests), rows)
    lengths = traffic_lengths(engine, model_version=V1, since=t0, until=t0 + dt.timedelta(minutes=1))
    assert sorted(lengths.prompt_tokens.tolist()) == list(range(10, 30))  # every prompt
    assert lengths.output_tokens.tolist() == [40] * 10  # only the answers that ended on their own
