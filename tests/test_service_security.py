"""Security and privacy of the HTTP API: reads of users' text need the token, every
oversize body is a 413 (chunked too, whatever the route), and client-chosen label values
cannot grow /metrics or the in-memory windows without bound."""

from __future__ import annotations

import dataclasses
import random
import string
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _service_support import TOKEN, auth, config, event, running
from _web_page_browser import serve
from conftest import free_port
from infersight.monitor.service import create_app
from infersight.monitor.service.config import AlertingConfig, DriftConfig, LimitsConfig, ScheduleConfig
from infersight.monitor.store.tables import requests
from sqlalchemy import func, select

RULES = """
groups:
  - name: latency
    interval: 1s
    rules:
      - alert: SlowAnswers
        signal: {kind: latency_quantile, metric: request_duration, quantile: 0.99, window: 1m}
        op: ">"
        threshold: 1.0
"""


def _cfg(tmp_path: Path, **overrides: Any):  # type: ignore[no-untyped-def]
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    return config(tmp_path, alerting=AlertingConfig(rules=rules), **overrides)


def _stored(app: Any) -> int:
    app.state.service.writer.flush()
    with app.state.service.db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(requests)).scalar_one())


# -- reads of text need the token ------------------------------------------------------------------
def test_reading_prompts_and_answers_needs_the_token_aggregates_stay_open(tmp_path: Path) -> None:
    with running(_cfg(tmp_path)) as (_app, client):
        secret = "my card number is 4111 1111 1111 1111"
        client.post("/api/v1/events", json={"events": [event(i, prompt=secret) for i in range(3)]},
                    headers=auth())  # fmt: skip
        snap = client.post("/api/v1/snapshots", json={"requests": 3}, headers=auth()).json()["snapshot_id"]
        for path in ("/api/v1/snapshots", f"/api/v1/snapshots/{snap}", "/api/v1/drift/1"):
            for headers in ({}, auth("wrong-token-0123456789"), {"Authorization": "Basic " + TOKEN}):
                r = client.get(path, headers=headers)
                assert r.status_code == 401, (path, headers, r.text)
                assert secret not in r.text and r.json()["error"]["field"] == "header.authorization"
                assert r.headers["www-authenticate"].startswith("Bearer")
        full = client.get(f"/api/v1/snapshots/{snap}", headers=auth())
        assert full.status_code == 200 and secret in full.text
        assert client.get("/api/v1/snapshots", headers=auth()).json()["snapshots"][0]["snapshot_id"] == snap
        # drift is off in this config: with the token the route answers, and not with a 401
        assert client.get("/api/v1/drift/1", headers=auth()).status_code == 503
        for path in ("/metrics", "/api/v1/overview", "/api/v1/timeseries", "/api/v1/alerts", "/healthz"):
            r = client.get(path)
            assert r.status_code == 200 and secret not in r.text, path


# -- 413 for every oversize body -------------------------------------------------------------------
def _chunks(total: int, piece: int = 256) -> Iterator[bytes]:
    """A JSON-looking body sent with Transfer-Encoding: chunked (no Content-Length)."""
    yield b'{"pad": "'
    for _ in range(total // piece):
        yield b"x" * piece
    yield b'"}'


ROUTES = [  # one per kind of route: raw body, pydantic body, optional pydantic body, OpenAI, webhook
    pytest.param("/api/v1/events", True, id="raw-body-ingest"),
    pytest.param("/api/v1/silences", True, id="pydantic-body"),
    pytest.param("/api/v1/models/deploy", True, id="pydantic-body-no-runtime"),
    pytest.param("/api/v1/snapshots", True, id="optional-pydantic-body"),
    pytest.param("/v1/completions", False, id="openai-completions"),
    pytest.param("/v1/chat/completions", False, id="openai-chat"),
    pytest.param("/api/v1/alertmanager", True, id="alertmanager-webhook"),
]


@pytest.fixture(scope="module")
def small_limit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, httpx.Client]]:
    """The service under uvicorn (real HTTP/1.1: a generator body goes out chunked)."""
    tmp = tmp_path_factory.mktemp("limit")
    app = create_app(_cfg(tmp, limits=LimitsConfig(max_body_bytes=4096)))
    with serve(app, free_port()) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield app, client


@pytest.mark.parametrize(("path", "token"), ROUTES)
def test_an_oversize_body_is_413_on_every_route_chunked_or_declared(
    small_limit, path: str, token: bool
) -> None:  # type: ignore[no-untyped-def]
    app, client = small_limit
    headers = {**(auth() if token else {}), "content-type": "application/json"}
    before = _stored(app)
    chunked = client.post(path, content=_chunks(20_000), headers=headers)
    assert chunked.request.headers["transfer-encoding"] == "chunked"
    assert chunked.status_code == 413, chunked.text
    assert chunked.json()["error"] == {
        "type": "payload_too_large", "field": "body", "message": "request body is larger than 4096 bytes"
    }  # fmt: skip
    declared = client.post(path, content=b"{" + b" " * 5000 + b"}", headers=headers)
    assert declared.status_code == 413, declared.text
    # just under the limit is read and judged by the route (not a 413)
    assert client.post(path, content=_chunks(3000), headers=headers).status_code not in (413, 500)
    assert _stored(app) == before


# -- label cardinality -----------------------------------------------------------------------------
def _random_name(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase + string.digits + "-_/.", k=rng.randint(8, 60)))


def test_ten_thousand_random_model_names_leave_metrics_and_memory_bounded(tmp_path: Path) -> None:
    rng = random.Random(7)
    cfg = config(
        tmp_path,
        limits=dataclasses.replace(LimitsConfig(), max_events_per_batch=1000),
        # drift on for its reservoir (the texts are offered per label set); its jobs never run here
        drift=DriftConfig(),
        schedule=ScheduleConfig(embed_s=3600.0, drift_s=3600.0),
    )
    with running(cfg) as (app, client):
        stats = app.state.service.parts.stats
        cap = stats.max_label_values

        def send(n: int) -> None:
            for start in range(0, n, 1000):
                batch = [event(start + i, model=_random_name(rng), model_version=_random_name(rng), prompt="q",
                               request_id=f"r-{time.monotonic_ns()}-{i}") for i in range(min(1000, n - start))]  # fmt: skip
                r = client.post("/api/v1/events", json={"events": batch}, headers=auth())
                assert r.status_code == 200 and r.json()["accepted"] == len(batch), r.text

        send(1000)
        size_1k = len(client.get("/metrics").content)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            send(9000)
            app.state.service.writer.flush()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        print(f"Python heap grew {grown / 1e6:.1f} MB over 9,000 more model names")
        assert grown < 20e6  # a series per name (sketch windows, histograms) would take hundreds of MB
        metrics = client.get("/metrics").text
        assert len(metrics.encode()) <= size_1k * 1.02  # 9,000 more names added nothing but counts
        labels = stats.labels()
        assert len(labels) <= cap + 1  # at most `cap` combinations, and (other, other)
        assert ("other", "other") in labels  # the overflow keeps the observations, under `other`
        sampled = app.state.service.reservoir.drain()  # texts for drift, kept per model version
        assert sampled and {(t.model, t.model_version) for t in sampled} <= set(labels)
        overflowed = {
            line.split('label="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("infersight_label_values_overflowed_total{")
        }
        assert overflowed["model"] >= 10_000 - cap and overflowed["model_version"] >= 10_000 - cap
        total = sum(
            float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
            if line.startswith("gen_ai_server_request_duration_seconds_count{")
        )  # fmt: skip
        assert total == 10_000  # nothing lost from the aggregates
        assert _stored(app) == 10_000  # the rows keep the names the clients sent
