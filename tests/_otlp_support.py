"""Helpers for the OTLP receiver's tests: a service on a real loopback port (uvicorn in a
thread), an OpenTelemetry SDK tracer whose real OTLP/HTTP exporter sends to it, and the
rows it stored."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from _service_support import TOKEN, wait_for
from conftest import free_port
from infersight.monitor.service import Service, ServiceConfig, create_app
from infersight.monitor.store.tables import requests
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from sqlalchemy import select


@dataclass
class Served:
    base: str
    service: Service

    def rows(self, **where: Any) -> list[Any]:
        """The stored requests that came over OTLP (after everything queued is written)."""
        assert self.service.writer is not None
        self.service.writer.flush()
        query = select(requests).where(requests.c.source == "otlp").order_by(requests.c.started_at)
        for name, value in where.items():
            query = query.where(requests.c[name] == value)
        with self.service.db.connect() as conn:
            return list(conn.execute(query).mappings())

    def metric(self, name: str, **labels: str) -> float:
        value = self.service.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


@contextmanager
def serving(
    cfg: ServiceConfig, *, before_start: Callable[[Service], None] | None = None, **seams: Any
) -> Iterator[Served]:
    """`cfg` served by uvicorn on a free loopback port (its `port` is replaced)."""
    import dataclasses

    import uvicorn

    port = free_port()
    cfg = dataclasses.replace(cfg, port=port)
    service = Service(cfg, **seams)
    if before_start is not None:
        before_start(service)
    service.start()
    server = uvicorn.Server(uvicorn.Config(create_app(cfg, service=service), host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))  # fmt: skip
    thread = threading.Thread(target=server.run, name="otlp-test-uvicorn", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=60)
        yield Served(f"http://127.0.0.1:{port}", service)
    finally:
        server.should_exit = True
        thread.join(30)
        service.stop()


def exporting_tracer(base: str, token: str = TOKEN, **resource: Any) -> TracerProvider:
    """A tracer provider whose spans go, one export per span, through the real OTLP/HTTP
    (protobuf) exporter to `base`/v1/traces with the bearer token."""
    exporter = OTLPSpanExporter(endpoint=f"{base}/v1/traces", headers={"Authorization": f"Bearer {token}"},
                                timeout=30)  # fmt: skip
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider
