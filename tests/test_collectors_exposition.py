"""/metrics: the small server for users without the sidecar, and the pieces the service mounts."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

from infersight.collectors import InferenceStats, metrics_asgi_app, render_metrics, serve_metrics
from prometheus_client import CollectorRegistry


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    InferenceStats(registry).add(model="m", model_version="v1", duration_s=0.3)
    return registry


def test_serve_metrics_answers_on_a_free_loopback_port_and_closes() -> None:
    with serve_metrics(_registry()) as server:
        assert server.url.startswith("http://127.0.0.1:") and server.port > 0
        with urllib.request.urlopen(server.url, timeout=5) as response:
            body = response.read().decode()
    assert 'gen_ai_server_request_duration_seconds_count{model="m",model_version="v1"} 1.0' in body


def test_render_metrics_negotiates_openmetrics_for_prometheus() -> None:
    body, content_type = render_metrics(_registry(), "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
    body, content_type = render_metrics(_registry())
    assert content_type.startswith("text/plain") and b"gen_ai_server_request_duration_seconds_bucket" in body


def test_asgi_app_serves_the_registry() -> None:
    app = metrics_asgi_app(_registry())
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/metrics", "query_string": b"", "headers": []}
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 200
    assert b"gen_ai_server_requests_in_flight" in b"".join(m.get("body", b"") for m in sent[1:])
