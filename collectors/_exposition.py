"""Serving a registry at /metrics: a small HTTP server, WSGI and ASGI apps, raw bytes.

The sidecar's FastAPI app mounts `render_metrics` (or `metrics_asgi_app`); a user
without the sidecar calls `serve_metrics(registry, port=9400)`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import make_asgi_app, make_wsgi_app, start_http_server
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

__all__ = ["MetricsServer", "metrics_asgi_app", "metrics_wsgi_app", "render_metrics", "serve_metrics"]


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
