"""Alerting through the service: rules over ingested traffic, the alerts, silences and
snapshots endpoints, and the inbound Alertmanager webhook behind the token."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from _service_support import auth, config, event, running, wait_for
from infersight.monitor.service.config import AlertingConfig, ScheduleConfig

RULES = """
groups:
  - name: latency
    interval: 1s
    rules:
      - alert: SlowAnswers
        signal: {kind: latency_quantile, metric: request_duration, quantile: 0.99, window: 1m}
        op: ">"
        threshold: 1.0
        by: [model, model_version]
        labels: {severity: critical}
        annotations: {summary: "p99 is {{ $value }}s"}
"""


def _cfg(tmp_path: Path):  # type: ignore[no-untyped-def]
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    return config(tmp_path, alerting=AlertingConfig(rules=rules),
                  schedule=ScheduleConfig(rules_s=0.2, timeseries_s=0.5))  # fmt: skip


def test_slow_ingested_traffic_fires_a_rule_seen_on_every_endpoint(tmp_path: Path) -> None:
    with running(_cfg(tmp_path)) as (_app, client):
        slow = [event(i, duration_s=2.5) for i in range(30)]
        assert client.post("/api/v1/events", json={"events": slow}, headers=auth()).json()["accepted"] == 30
        firing = wait_for(lambda: [a for a in client.get("/api/v1/alerts?state=firing").json()["alerts"]
                                   if a["alertname"] == "SlowAnswers"])  # fmt: skip
        assert firing[0]["labels"]["model_version"] == "mixtral_banking_fp32-v1.0"
        assert firing[0]["value"] >= 2.0
        overview = client.get("/api/v1/overview").json()
        assert overview["health"] == "degraded"
        assert overview["firing_alerts"][0]["alertname"] == "SlowAnswers"
        assert overview["firing_alerts"][0]["severity"] == "critical"
        assert (
            'infersight_alerts_firing{alertname="SlowAnswers",severity="critical"} 1.0'
            in client.get("/metrics").text
        )


def test_silences_are_created_listed_and_expired_with_the_token(tmp_path: Path) -> None:
    with running(_cfg(tmp_path)) as (_app, client):
        body = {"matchers": [{"name": "alertname", "value": "SlowAnswers"}],
                "endsAt": (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat(),
                "createdBy": "oncall", "comment": "known, fixing"}  # fmt: skip
        assert client.post("/api/v1/silences", json=body).status_code == 401
        r = client.post("/api/v1/silences", json=body, headers=auth())
        assert r.status_code == 201
        sid = r.json()["silenceID"]
        listed = client.get("/api/v1/silences").json()["silences"]
        assert [s["id"] for s in listed] == [sid] and listed[0]["status"]["state"] == "active"
        bad = {**body, "matchers": [{"name": "x", "value": ".*", "isRegex": True}]}
        r = client.post("/api/v1/silences", json=bad, headers=auth())
        assert r.status_code == 422 and r.json()["error"]["field"] == "body.matchers"
        assert client.delete(f"/api/v1/silences/{sid}").status_code == 401
        assert client.delete(f"/api/v1/silences/{sid}", headers=auth()).status_code == 200
        assert client.delete(f"/api/v1/silences/{sid}", headers=auth()).status_code == 404
        assert client.get("/api/v1/silences").json()["silences"] == []


def test_a_snapshot_taken_by_hand_keeps_the_latest_requests(tmp_path: Path) -> None:
    with running(_cfg(tmp_path)) as (_app, client):
        client.post(
            "/api/v1/events", json={"events": [event(i, prompt=f"q{i}") for i in range(5)]}, headers=auth()
        )
        assert client.post("/api/v1/snapshots", json={"reason": "checking"}).status_code == 401
        r = client.post("/api/v1/snapshots", json={"reason": "checking", "requests": 3}, headers=auth())
        assert r.status_code == 201
        snap = r.json()
        assert snap["request_count"] == 3 and Path(snap["html_path"]).is_file()
        listed = client.get("/api/v1/snapshots", headers=auth()).json()["snapshots"]
        assert listed[0]["snapshot_id"] == snap["snapshot_id"] and listed[0]["trigger"] == "manual"
        full = client.get(f"/api/v1/snapshots/{snap['snapshot_id']}", headers=auth()).json()
        assert len(full["requests"]) == 3 and "gen_ai_server_request_duration_seconds" in full["metrics"]
        assert client.get("/api/v1/snapshots/nope", headers=auth()).status_code == 404


def test_the_alertmanager_webhook_needs_the_token_and_runs_the_labelled_action(tmp_path: Path) -> None:
    payload = {
        "version": "4", "groupKey": "{}:{alertname=\"HighLatency\"}", "status": "firing", "receiver": "infersight",
        "groupLabels": {"alertname": "HighLatency"}, "commonLabels": {}, "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093", "truncatedAlerts": 0,
        "alerts": [{"status": "firing", "labels": {"alertname": "HighLatency", "infersight_action": "snapshot"},
                    "annotations": {"summary": "slow"}, "startsAt": "2026-11-01T10:00:00Z",
                    "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": "abc123"}],
    }  # fmt: skip
    with running(_cfg(tmp_path)) as (_app, client):
        assert client.post("/api/v1/alertmanager", json=payload).status_code == 401
        r = client.post("/api/v1/alertmanager", json=payload, headers=auth())
        assert r.status_code == 200, r.text
        again = client.post("/api/v1/alertmanager", json=payload, headers=auth())  # an HA peer's copy
        assert again.status_code == 200
        snaps = client.get("/api/v1/snapshots", headers=auth()).json()["snapshots"]
        assert len(snaps) == 1  # ran once
        assert client.post("/api/v1/alertmanager", json={"version": "3"}, headers=auth()).status_code == 400
