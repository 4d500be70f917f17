"""The HTTP API's own behaviour: health, metrics, ingest, tokens, limits, errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from _service_support import TOKEN, auth, config, event, running
from infersight.monitor.service import Service, ServiceConfig
from infersight.monitor.service.config import LimitsConfig
from infersight.monitor.service.errors import InsecureBind
from infersight.monitor.store.tables import requests
from sqlalchemy import func, select


def _stored(app) -> int:  # type: ignore[no-untyped-def]
    with app.state.service.db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(requests)).scalar_one())


def test_health_readiness_and_openapi(tmp_path: Path) -> None:
    with running(config(tmp_path)) as (_app, client):
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        paths = client.get("/openapi.json").json()["paths"]
        for path in ("/api/v1/events", "/v1/completions", "/v1/chat/completions", "/api/v1/models",
                     "/api/v1/models/deploy", "/api/v1/models/rollback", "/api/v1/overview",
                     "/api/v1/timeseries", "/metrics"):  # fmt: skip
            assert path in paths, path


def test_ingest_keeps_good_events_and_names_the_field_of_bad_ones(tmp_path: Path) -> None:
    with running(config(tmp_path)) as (app, client):
        events = [
            event(0),
            event(1, duration_s=-1),
            event(2, model=""),
            event(3),
            {"nope": 1},
            event(4, source="x"),
        ]
        r = client.post("/api/v1/events", json={"events": events}, headers=auth())
        assert r.status_code == 200
        body = r.json()
        assert body["accepted"] == 2
        assert [(x["index"], x["field"]) for x in body["rejected"]] == [
            (1, "duration_s"), (2, "model"), (4, "nope"), (5, "source"),
        ]  # fmt: skip
        assert _stored(app) == 2
        metrics = client.get("/metrics").text
        assert 'infersight_ingest_events_total{outcome="accepted"} 2.0' in metrics
        assert 'gen_ai_server_request_duration_seconds_count{model="mixtral_banking"' in metrics


def test_ingest_is_idempotent_for_a_retried_batch(tmp_path: Path) -> None:
    with running(config(tmp_path)) as (app, client):
        batch = {"events": [event(i) for i in range(50)]}
        for _ in range(2):
            assert client.post("/api/v1/events", json=batch, headers=auth()).json()["accepted"] == 50
        assert _stored(app) == 50


def test_events_the_store_cannot_hold_are_rejected_not_failed(tmp_path: Path) -> None:
    with running(config(tmp_path)) as (_app, client):
        events = [event(0, started_at=1e300), event(1, prompt_tokens=2**40), event(2, prompt="nul\x00byte")]
        body = client.post("/api/v1/events", json={"events": events}, headers=auth()).json()
        assert [(x["index"], x["field"]) for x in body["rejected"]] == [
            (0, "started_at"),
            (1, "prompt_tokens"),
        ]
        assert body["accepted"] == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "body"),
        (b"[1, 2]", "body"),
        (b'{"events": 3}', "body.events"),
        (b'{"events": [], "extra": 1}', "body.extra"),
    ],
)
def test_a_malformed_batch_is_422_naming_the_field(tmp_path: Path, body: bytes, field: str) -> None:
    with running(config(tmp_path)) as (_app, client):
        r = client.post(
            "/api/v1/events", content=body, headers={**auth(), "content-type": "application/json"}
        )
        assert r.status_code == 422
        assert r.json()["error"]["field"] == field


def test_state_changing_endpoints_need_the_token(tmp_path: Path) -> None:
    with running(config(tmp_path)) as (_app, client):
        for path, body in (("/api/v1/events", {"events": []}), ("/api/v1/models/rollback", None),
                           ("/api/v1/models/deploy", {"version": "mixtral_banking_fp32-v1.0"})):  # fmt: skip
            for headers in ({}, auth("wrong-token-wrong-token"), {"Authorization": f"Basic {TOKEN}"}):
                r = client.post(path, json=body, headers=headers)
                assert r.status_code == 401, (path, headers)
                assert r.headers["www-authenticate"].startswith("Bearer")
        assert client.post("/api/v1/events", json={"events": []}, headers=auth()).status_code == 200


def test_a_body_over_the_limit_is_413_before_it_is_read(tmp_path: Path) -> None:
    cfg = config(tmp_path, limits=LimitsConfig(max_body_bytes=1000))
    with running(cfg) as (app, client):
        big = {"events": [event(i) for i in range(20)]}
        r = client.post("/api/v1/events", json=big, headers=auth())
        assert r.status_code == 413
        assert r.json()["error"]["field"] == "body"

        def chunks():  # no Content-Length: cut off while streaming
            for _ in range(20):
                yield b" " * 100

        r = client.post(
            "/api/v1/events", content=chunks(), headers={**auth(), "content-type": "application/json"}
        )
        assert r.status_code == 413
        assert _stored(app) == 0


def test_too_many_events_in_one_batch_is_refused(tmp_path: Path) -> None:
    cfg = config(tmp_path, limits=LimitsConfig(max_events_per_batch=10))
    with running(cfg) as (_app, client):
        r = client.post("/api/v1/events", json={"events": [event(i) for i in range(11)]}, headers=auth())
        assert r.status_code == 422 and r.json()["error"]["field"] == "body.events"


def test_a_full_write_queue_answers_503_with_retry_after_and_accepts_nothing(tmp_path: Path) -> None:
    cfg = config(tmp_path, limits=LimitsConfig(write_queue_rows=5))
    with running(cfg) as (app, client):
        r = client.post("/api/v1/events", json={"events": [event(i) for i in range(6)]}, headers=auth())
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert _stored(app) == 0


def test_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    with pytest.raises(InsecureBind, match="INFERSIGHT_TOKEN"):
        Service(ServiceConfig(data_dir=tmp_path, host="0.0.0.0"))
    Service(ServiceConfig(data_dir=tmp_path, host="0.0.0.0", token=TOKEN)).db.dispose()


def test_without_a_configured_token_one_is_generated_and_kept_private(tmp_path: Path) -> None:
    cfg = dataclasses.replace(config(tmp_path), token=None)
    with running(cfg) as (app, client):
        token = app.state.token
        path = cfg.data_dir / "api-token"
        assert path.read_text().strip() == token
        assert path.stat().st_mode & 0o077 == 0
        assert client.post("/api/v1/events", json={"events": []}, headers=auth(token)).status_code == 200
    with running(cfg) as (app, client):
        assert app.state.token == token  # kept across restarts


def test_the_page_timeseries_fills_with_one_point_per_tick(tmp_path: Path) -> None:
    from _service_support import wait_for

    with running(config(tmp_path)) as (_app, client):
        client.post("/api/v1/events", json={"events": [event(i) for i in range(40)]}, headers=auth())
        data = wait_for(lambda: (d := client.get("/api/v1/timeseries?window=60").json())["t"] and
                        d["series"]["latency_p50_s"][-1] is not None and d)  # fmt: skip
        assert set(data["series"]) >= {"latency_p50_s", "latency_p95_s", "latency_p99_s", "ttft_p95_s",
                                       "requests_per_s", "gpu_sm_activity_ratio", "process_rss_bytes"}  # fmt: skip
        assert all(len(v) == len(data["t"]) for v in data["series"].values())
        assert 0.05 <= data["series"]["latency_p50_s"][-1] <= 0.15
        assert data["series"]["process_rss_bytes"][-1] > 10_000_000  # this very process
        assert client.get("/api/v1/timeseries?window=-1").status_code == 422
        overview = client.get("/api/v1/overview").json()
        assert set(overview) >= {
            "model",
            "serving_version",
            "health",
            "uptime_s",
            "firing_alerts",
            "drift",
            "deploys",
        }


@pytest.mark.parametrize("tick_s", [1.0, 5.0, 7.0])
def test_the_requests_per_s_chart_reads_a_steady_rate_within_ten_percent(tick_s: float) -> None:
    from infersight.collectors import InferenceStats
    from infersight.monitor.service.metrics import timeseries_point

    now = [1000.0]
    stats = InferenceStats(clock=lambda: now[0])  # 10 s intervals, as served
    readings = []
    for i in range(5 * 120):  # 5.00 requests/s for two minutes, one every 0.2 s
        now[0] += 0.2
        stats.add(model="m", model_version="m-v1", duration_s=0.05, error_type="Boom" if i % 5 == 0 else None)
        if i > 5 * 20 and round(now[0] / 0.2) % round(tick_s / 0.2) == 0:  # a tick, after 20 s
            readings.append(timeseries_point(stats, None, None, window_s=60, tick_s=tick_s))
    assert len(readings) >= 10
    rates = [r["requests_per_s"] for r in readings]
    assert all(abs(rate - 5.0) <= 0.5 for rate in rates), rates  # was a sawtooth from 10 to 55
    assert all(abs(r["errors_per_s"] - 1.0) <= 0.1 + 1e-9 for r in readings), readings


def test_stored_requests_read_back_exactly_as_sent(tmp_path: Path) -> None:
    import datetime as dt

    sent = event(
        7, started_at=1_764_400_000.123456, prompt="où est ma carte ?", response="dans l'app", queue_s=None
    )
    with running(config(tmp_path)) as (app, client):
        client.post("/api/v1/events", json={"events": [sent]}, headers=auth())
        with app.state.service.db.connect() as conn:
            row = conn.execute(select(requests)).one()
            since = dt.datetime.fromtimestamp(1_764_400_000.1234, dt.UTC)
            later = conn.execute(select(func.count()).where(requests.c.started_at >= since)).scalar_one()
    assert row.started_at == dt.datetime.fromtimestamp(1_764_400_000.123456, dt.UTC)
    assert (row.prompt, row.response, row.queue_s, row.source) == (
        "où est ma carte ?",
        "dans l'app",
        None,
        "sdk",
    )
    assert later == 1


def test_the_web_page_is_served_at_the_root(tmp_path: Path) -> None:
    with running(config(tmp_path)) as (_app, client):
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "api/v1/overview" in client.get("/app.js").text  # the page reads the service's endpoints
        assert client.get("/api/v1/overview").status_code == 200  # the API still wins over the static mount


def test_ingest_on_a_shared_postgresql(tmp_path: Path, postgres_url: str) -> None:
    import dataclasses

    cfg = dataclasses.replace(config(tmp_path), database_url=postgres_url)
    with running(cfg) as (app, client):
        batch = [event(i, prompt="nul\x00inside" if i == 0 else None) for i in range(40)]
        for _ in range(2):  # a retried batch is kept once
            assert (
                client.post("/api/v1/events", json={"events": batch}, headers=auth()).json()["accepted"] == 40
            )
        assert _stored(app) == 40
        with app.state.service.db.connect() as conn:
            prompt = conn.execute(
                select(requests.c.prompt).where(requests.c.request_id == "r-0")
            ).scalar_one()
        assert prompt == "nul\ufffdinside"
        assert client.get("/readyz").json()["status"] == "ready"
