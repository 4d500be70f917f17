"""Nothing acknowledged is lost: the OpenTelemetry SDK (batch span processor, real OTLP/HTTP
exporter) streams GenAI spans to a real `infersight serve` process (ingest only, SQLite),
which is killed with SIGKILL in the middle of the stream. Every span of every export the
server answered 2xx is in its database afterwards. The exporter's requests session is
wrapped to see which exports were answered 2xx (the exporter reports no more than that)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import requests
from _service_support import TOKEN, wait_for
from conftest import free_port
from infersight.monitor.store import connect, sqlite_url
from infersight.monitor.store.tables import requests as request_rows
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind
from sqlalchemy import select


class CountingSession(requests.Session):
    """The exporter's session: remembers the request ids of each export and its answer."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.acknowledged: list[set[str]] = []
        self.failed = 0

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        export = ExportTraceServiceRequest.FromString(kwargs.get("data") or b"")
        ids = {
            f"otlp-{s.trace_id.hex()}-{s.span_id.hex()}"
            for rs in export.resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        }
        try:
            response = super().request(method, url, *args, **kwargs)
        except requests.RequestException:
            with self.lock:
                self.failed += 1
            raise
        with self.lock:
            if 200 <= response.status_code < 300:
                self.acknowledged.append(ids)
            else:
                self.failed += 1
        return response


def _serve(tmp_path: Path, port: int) -> subprocess.Popen[str]:
    cfg = tmp_path / "infersight.yaml"
    cfg.write_text("drift: {enabled: false}\nalerting: {enabled: false}\n", encoding="utf-8")
    return subprocess.Popen(
        [sys.executable, "-m", "infersight.monitor.cli", "serve", "--config", str(cfg), "--port", str(port),
         "--data-dir", str(tmp_path / "data"), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "INFERSIGHT_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def test_sigkill_during_a_stream_of_sdk_exports_loses_no_acknowledged_span(tmp_path: Path) -> None:
    port = free_port()
    server = _serve(tmp_path, port)
    session = CountingSession()
    stop = threading.Event()
    try:

        def up() -> bool:
            if server.poll() is not None:
                raise AssertionError(server.stderr.read() if server.stderr else "serve exited")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=60, interval=0.1)
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=2, session=session,
                                    headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
        provider.add_span_processor(
            BatchSpanProcessor(exporter, schedule_delay_millis=10, max_export_batch_size=16)
        )
        tracer = provider.get_tracer("vllm")

        def produce() -> None:
            i = 0
            while not stop.is_set():
                span = tracer.start_span("llm_request", kind=SpanKind.SERVER, attributes={
                    "gen_ai.response.model": "llama", "gen_ai.usage.prompt_tokens": 10 + i % 7,
                    "gen_ai.usage.completion_tokens": 5, "gen_ai.latency.e2e": 0.1})  # fmt: skip
                span.end()
                i += 1
                if i % 16 == 0:
                    time.sleep(0.005)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        wait_for(lambda: len(session.acknowledged) >= 30, timeout=60, interval=0.01)
        os.kill(server.pid, signal.SIGKILL)  # exports are in flight: the producer never paused
        assert server.wait(10) == -signal.SIGKILL
        wait_for(lambda: session.failed >= 1, timeout=30, interval=0.01)  # the stream went on into the kill
        stop.set()
        producer.join(10)
        exporter.shutdown()  # the spans still queued fail at once instead of retrying against the dead server
        provider.shutdown()
    finally:
        stop.set()
        if server.poll() is None:
            server.kill()
            server.wait(10)
    acknowledged = set().union(*session.acknowledged)
    engine = connect(sqlite_url(tmp_path / "data"))
    try:
        with engine.connect() as conn:
            stored = {r for (r,) in conn.execute(select(request_rows.c.request_id))}
    finally:
        engine.dispose()
    assert len(acknowledged) >= 30  # at least one span in each of 30 acknowledged exports
    assert acknowledged <= stored, f"{len(acknowledged - stored)} acknowledged spans are missing"
