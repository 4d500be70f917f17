"""Serving a registry at /metrics: a small HTTP server, WSGI and ASGI apps, raw bytes.

The sidecar's FastAPI app mounts `render_metrics` (or `metrics_asgi_app`); a user
without the sidecar calls `serve_metrics(registry, port=9400)`.

The metric families of `InferenceStats` (names: docs/architecture.md) are built here at
scrape time (`inference_families`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import make_asgi_app, make_wsgi_app, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from ._series import Series

__all__ = [
    "HISTOGRAM_NAMES",
    "MetricsServer",
    "describe_families",
    "inference_families",
    "metrics_asgi_app",
    "metrics_wsgi_app",
    "render_metrics",
    "serve_metrics",
]


@dataclass
class MetricsServer:
    host: str
    port: int
    _server: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_metrics(registry: CollectorRegistry, *, port: int = 0, host: str = "127.0.0.1") -> MetricsServer:
    """Serve `registry` at `http://host:port/metrics` on a daemon thread (port 0: any free one)."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(host=host, port=int(server.server_port), _server=server, _thread=thread)


def render_metrics(registry: CollectorRegistry, accept: str | None = None) -> tuple[bytes, str]:
    """The exposition body and its content type, for the `Accept` header given."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


def metrics_wsgi_app(registry: CollectorRegistry) -> Callable[..., Any]:
    return make_wsgi_app(registry)


def metrics_asgi_app(registry: CollectorRegistry) -> Callable[..., Any]:
    return make_asgi_app(registry)


_LABELS = ["model", "model_version"]

HISTOGRAM_NAMES = {
    "request_duration": (
        "gen_ai_server_request_duration_seconds",
        "End-to-end request latency, including failed requests.",
    ),
    "ttft": ("gen_ai_server_time_to_first_token_seconds", "Time to first output token (streaming calls)."),
    "tpot": (
        "gen_ai_server_time_per_output_token_seconds",
        "Mean time per output token after the first, per request.",
    ),
    "queue_time": ("gen_ai_server_request_queue_time_seconds", "Time queued before scheduling."),
}
_TOKENS = ("gen_ai_server_token_usage", "Tokens per request, by gen_ai_token_type (input, output).")
_IN_FLIGHT = ("gen_ai_server_requests_in_flight", "Requests started and not yet finished.")
_WAITING = ("gen_ai_server_requests_waiting", "Requests queued, not yet scheduled.")
_ERRORS = (
    "gen_ai_server_request_errors",
    "Requests failed by the server, by error_type (the exception's class name).",
)
_CLIENT = (
    "infersight_client_outcomes",
    "Requests that ended without a server error: outcome client_error (refused: e.g. an over-long "
    "prompt, an upstream 4xx), cancelled (the client hung up) or shed (refused with 503 by SLA "
    "routing's length breaker).",
)


def _empty() -> list[Metric]:
    families: list[Metric] = [
        HistogramMetricFamily(name, doc, labels=_LABELS) for name, doc in HISTOGRAM_NAMES.values()
    ]
    families.append(HistogramMetricFamily(*_TOKENS, labels=[*_LABELS, "gen_ai_token_type"]))
    families.append(GaugeMetricFamily(*_IN_FLIGHT, labels=_LABELS))
    families.append(GaugeMetricFamily(*_WAITING, labels=_LABELS))
    families.append(CounterMetricFamily(*_ERRORS, labels=[*_LABELS, "error_type"]))
    families.append(CounterMetricFamily(*_CLIENT, labels=[*_LABELS, "outcome"]))
    return families


def describe_families() -> list[Metric]:
    return _empty()


def inference_families(series: Sequence[Series], in_flight: dict[int, int]) -> list[Metric]:
    families = _empty()
    by_name = {f.name: f for f in families}
    for s in series:
        labels = [s.model, s.model_version]
        for metric, (name, _doc) in HISTOGRAM_NAMES.items():
            h = s.histograms[metric]
            fam = by_name[name]
            assert isinstance(fam, HistogramMetricFamily)
            fam.add_metric(labels, h.cumulative(), h.sum)
        tokens = by_name[_TOKENS[0]]
        assert isinstance(tokens, HistogramMetricFamily)
        for token_type, h in s.tokens.items():
            tokens.add_metric([*labels, token_type], h.cumulative(), h.sum)
        _gauge(by_name[_IN_FLIGHT[0]]).add_metric(labels, in_flight.get(id(s), 0))
        _gauge(by_name[_WAITING[0]]).add_metric(labels, s.waiting)
        errors = by_name[_ERRORS[0]]
        assert isinstance(errors, CounterMetricFamily)
        for error_type, n in sorted(s.errors.items()):
            errors.add_metric([*labels, error_type], n)
        client = by_name[_CLIENT[0]]
        assert isinstance(client, CounterMetricFamily)
        for outcome, n in sorted(s.client_outcomes.items()):
            client.add_metric([*labels, outcome], n)
    return families


def _gauge(family: Metric) -> GaugeMetricFamily:
    assert isinstance(family, GaugeMetricFamily)
    return family
