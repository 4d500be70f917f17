"""Inbound Alertmanager webhooks: validation (400 with the field), duplicates from
re-sends and HA peers recognised, and a REAL Alertmanager (Debian's
prometheus-alertmanager) delivering to the router served by uvicorn."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from conftest import free_port, require_executable
from fastapi import Depends, FastAPI, Header, HTTPException
from fastapi.testclient import TestClient
from infersight.alerts import ActionRunner, AlertmanagerHandler
from infersight.alerts.inbound_router import alertmanager_router
from infersight.monitor.store.tables import action_runs, inbound_keys, snapshots
from sqlalchemy import Engine, func, select
from test_alerts_support import database

TOKEN = "s3cret-token"


@pytest.fixture
def sqlite_db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    with database("sqlite", tmp_path, request) as engine:
        yield engine


def bearer(authorization: str | None = Header(default=None)) -> None:
    if authorization != f"Bearer {TOKEN}":
        raise HTTPException(401, "bearer token required")


def app_for(engine: Engine, tmp_path: Path) -> FastAPI:
    handler = AlertmanagerHandler(engine, ActionRunner(engine, data_dir=tmp_path))
    app = FastAPI()
    app.include_router(alertmanager_router(handler, dependencies=[Depends(bearer)]))
    return app


def payload(
    action: str = "snapshot", status: str = "firing", fingerprint: str = "3f2a9b", **extra: Any
) -> dict:
    alert = {
        "status": status,
        "labels": {"alertname": "HighLatency", "severity": "critical", "infersight_action": action},
        "annotations": {"summary": "p99 high"},
        "startsAt": "2027-01-15T08:00:00.123456789Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fingerprint,
    }
    body = {
        "version": "4",
        "groupKey": '{}:{alertname="HighLatency"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "infersight",
        "groupLabels": {"alertname": "HighLatency"},
        "commonLabels": dict(alert["labels"]),
        "commonAnnotations": alert["annotations"],
        "externalURL": "http://alertmanager:9093",
        "alerts": [alert],
    }
    body.update(extra)
    return body


def runs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(action_runs)).scalar() or 0)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b.update(version="3"), "version"),
        (lambda b: b.update(alerts=[]), "alerts"),
        (lambda b: b["alerts"][0].pop("fingerprint"), "alerts[0].fingerprint"),
        (lambda b: b["alerts"][0].update(startsAt="yesterday"), "alerts[0].startsAt"),
        (
            lambda b: b["alerts"][0]["labels"].update(infersight_action="reboot"),
            "alerts[0].labels.infersight_action",
        ),
        (lambda b: b["alerts"][0]["labels"].update(severity=3), "alerts[0].labels.severity"),
        (lambda b: b["alerts"][0].update(status="maybe"), "alerts[0].status"),
        # "²".isdigit() is true and int("²") raises: a 400, not a 500
        (
            lambda b: b["alerts"][0]["labels"].update(infersight_requests="²"),
            "alerts[0].labels.infersight_requests",
        ),
        (lambda b: b["alerts"][0].update(startsAt="0001-01-01T00:00:00+01:00"), "alerts[0].startsAt"),
    ],
)
def test_malformed_payload_gets_400_with_the_field(
    mutate: Any, field: str, sqlite_db: Engine, tmp_path: Path
) -> None:
    body = payload()
    mutate(body)
    with TestClient(app_for(sqlite_db, tmp_path)) as client:
        r = client.post("/api/v1/alertmanager", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 400 and r.json()["detail"]["field"] == field, r.text
    assert runs(sqlite_db) == 0


def test_non_json_body_and_missing_token_are_refused(sqlite_db: Engine, tmp_path: Path) -> None:
    with TestClient(app_for(sqlite_db, tmp_path)) as client:
        bad = client.post(
            "/api/v1/alertmanager", content=b"{nope", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert bad.status_code == 400 and bad.json()["detail"]["field"] == "body"
        assert client.post("/api/v1/alertmanager", json=payload()).status_code == 401


def test_deeply_nested_body_is_a_400_not_a_recursion_error(sqlite_db: Engine, tmp_path: Path) -> None:
    nested = b"[" * 100_000 + b"]" * 100_000
    with TestClient(app_for(sqlite_db, tmp_path), raise_server_exceptions=False) as client:
        r = client.post("/api/v1/alertmanager", content=nested, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 400 and r.json()["detail"]["field"] == "body", r.text
    assert runs(sqlite_db) == 0


def test_same_starts_at_spelled_differently_is_a_duplicate(sqlite_db: Engine, tmp_path: Path) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    spellings = ["2027-01-15T08:00:00Z", "2027-01-15T08:00:00.000Z", "2027-01-15T09:00:00+01:00",
                 "2027-01-15T08:00:00.000000000Z"]  # fmt: skip
    with TestClient(app_for(sqlite_db, tmp_path)) as client:
        answers = []
        for starts_at in spellings:
            body = payload()
            body["alerts"][0]["startsAt"] = starts_at
            answers.append(client.post("/api/v1/alertmanager", json=body, headers=auth).json())
    assert [a["duplicates"] for a in answers] == [0, 1, 1, 1], answers
    assert runs(sqlite_db) == 1


def test_resend_and_ha_peer_copies_run_the_action_once(sqlite_db: Engine, tmp_path: Path) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(app_for(sqlite_db, tmp_path)) as client:
        first = client.post("/api/v1/alertmanager", json=payload(), headers=auth).json()
        assert first["actions"][0]["state"] == "succeeded" and first["duplicates"] == 0
        again = client.post("/api/v1/alertmanager", json=payload(), headers=auth).json()
        assert again["duplicates"] == 1 and again["actions"] == []
        peers: list[dict] = []
        body = payload(fingerprint="77aa01")
        threads = [
            threading.Thread(
                target=lambda: peers.append(
                    client.post("/api/v1/alertmanager", json=body, headers=auth).json()
                )
            )
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        resolved = client.post("/api/v1/alertmanager", json=payload(status="resolved"), headers=auth).json()
    assert resolved["duplicates"] == 0 and resolved["actions"] == []  # a new status is news, but runs nothing
    assert runs(sqlite_db) == 2  # one per alert episode, whatever the number of copies
    with sqlite_db.connect() as conn:
        states = sorted(r.state for r in conn.execute(select(action_runs)))
        assert states == ["refused", "succeeded"]  # the second episode fell inside the snapshot's cooldown
        assert conn.execute(select(func.count()).select_from(snapshots)).scalar() == 1
        assert conn.execute(select(func.count()).select_from(inbound_keys)).scalar() == 3


class Server:
    def __init__(self, app: FastAPI) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def test_real_alertmanager_triggers_the_action_exactly_once(sqlite_db: Engine, tmp_path: Path) -> None:
    binary = require_executable("prometheus-alertmanager")
    received: list[dict] = []
    app = app_for(sqlite_db, tmp_path)

    @app.middleware("http")
    async def record(request: Any, call_next: Any) -> Any:
        received.append(json.loads(await request.body()))
        return await call_next(request)

    with Server(app) as hook:
        config = tmp_path / "alertmanager.yml"
        config.write_text(f"""
route:
  receiver: infersight
  group_by: [alertname]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 2s
receivers:
  - name: infersight
    webhook_configs:
      - url: http://127.0.0.1:{hook.port}/api/v1/alertmanager
        send_resolved: true
        http_config:
          authorization: {{type: Bearer, credentials: {TOKEN}}}
""")
        port = free_port()
        am = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.path={tmp_path / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            api = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{api}/-/ready", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline and am.poll() is None, "alertmanager did not start"
                time.sleep(0.1)
            alert = {
                "labels": {
                    "alertname": "ModelErrors",
                    "severity": "critical",
                    "infersight_action": "snapshot",
                    "infersight_requests": "10",
                },
                "annotations": {"summary": "error spike seen by Prometheus"},
                "startsAt": dt.datetime.now(dt.UTC).isoformat(),
                "generatorURL": "http://prometheus.example/graph",
            }
            assert httpx.post(f"{api}/api/v2/alerts", json=[alert], timeout=5).status_code == 200
            deadline = time.monotonic() + 30
            while len(received) < 2:  # the first delivery and at least one re-send (repeat_interval)
                assert time.monotonic() < deadline, f"Alertmanager sent {len(received)} payloads"
                time.sleep(0.1)
        finally:
            am.terminate()
            am.wait(timeout=10)
    first = received[0]
    assert first["version"] == "4" and first["receiver"] == "infersight" and first["status"] == "firing"
    assert first["groupLabels"] == {"alertname": "ModelErrors"} and first["alerts"][0]["fingerprint"]
    with sqlite_db.connect() as conn:
        [run] = conn.execute(select(action_runs)).all()
        assert (run.action, run.state, run.trigger, run.alertname) == (
            "snapshot",
            "succeeded",
            "alertmanager",
            "ModelErrors",
        )
        assert conn.execute(select(func.count()).select_from(snapshots)).scalar() == 1
