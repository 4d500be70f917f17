"""Incident data collection through the running service: a real alert over ingested traffic
runs the rule's `collect` action, the next requests of the alerted version are kept, and
`GET /api/v1/dataset` streams them as JSONL behind the token, through the configured
redact hook; bad query parameters are a 422 naming the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

from _service_support import auth, config, event, running, wait_for
from infersight.monitor.service.config import AlertingConfig, ScheduleConfig

V1 = "mixtral_banking_fp32-v1.0"
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
        actions: [{type: collect, n: 5}]
"""
PHONE = re.compile(r"\+?\d[\d ]{7,}\d")


def mask_phones(text: str) -> str:
    return PHONE.sub("<phone>", text)


def test_a_firing_alert_collects_the_next_requests_and_the_api_exports_them_redacted(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    cfg = config(tmp_path, alerting=AlertingConfig(rules=rules), redact="test_service_dataset:mask_phones",
                 schedule=ScheduleConfig(rules_s=0.2, timeseries_s=0.5))  # fmt: skip
    with running(cfg) as (_app, client):
        slow = [event(i, duration_s=2.5, prompt=f"slow one {i}", response="late") for i in range(30)]
        assert client.post("/api/v1/events", json={"events": slow}, headers=auth()).json()["accepted"] == 30
        wait_for(lambda: [a for a in client.get("/api/v1/alerts?state=firing").json()["alerts"]
                          if a["alertname"] == "SlowAnswers"])  # fmt: skip
        wait_for(lambda: client.get(f"/api/v1/dataset?version={V1}&kind=collected", headers=auth()).status_code
                 == 200)  # fmt: skip
        after = [event(100 + i, prompt=f"call me on +44 20 7946 0{i:03d}, question {i}", response=f"answer {i}")
                 for i in range(8)]  # fmt: skip
        assert client.post("/api/v1/events", json={"events": after}, headers=auth()).json()["accepted"] == 8

        def collected() -> list[dict[str, object]]:
            r = client.get(f"/api/v1/dataset?version={V1}&kind=collected", headers=auth())
            assert r.status_code == 200 and r.headers["content-type"].startswith("application/jsonl")
            lines = [json.loads(x) for x in r.text.splitlines()]
            return lines if len(lines) == 5 else []

        rows = wait_for(collected)
        assert [r["request_id"] for r in rows] == [
            f"r-{100 + i}" for i in range(5)
        ]  # the next 5, none before
        assert rows[0]["prompt"] == "call me on <phone>, question 0" and rows[0]["answer"] == "answer 0"
        assert "7946" not in json.dumps(rows)

        # user text needs the token; bad parameters name the field; no rows is an empty answer
        assert client.get(f"/api/v1/dataset?version={V1}").status_code == 401
        bad_kind = client.get(f"/api/v1/dataset?version={V1}&kind=weird", headers=auth())
        assert bad_kind.status_code == 422 and bad_kind.json()["error"]["field"] == "query.kind"
        bad_since = client.get(f"/api/v1/dataset?version={V1}&since=someday", headers=auth())
        assert bad_since.status_code == 422 and bad_since.json()["error"]["field"] == "query.since"
        for far in (
            "99999999999d",
            "9" * 60 + "w",
            "0001-01-01T00:00:00+01:00",
        ):  # before year 1: OverflowError
            r = client.get("/api/v1/dataset", params={"version": V1, "since": far}, headers=auth())
            assert r.status_code == 422 and r.json()["error"]["field"] == "query.since", (far, r.text)
        missing = client.get("/api/v1/dataset", headers=auth())
        assert missing.status_code == 422 and missing.json()["error"]["field"] == "query.version"
        none = client.get("/api/v1/dataset?version=no-such-version", headers=auth())
        assert none.status_code == 200 and none.text == ""
