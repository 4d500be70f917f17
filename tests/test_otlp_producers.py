"""Real OpenTelemetry producers feed infersight: an app using the official `openai` client,
instrumented with OpenLLMetry (`opentelemetry-instrumentation-openai`) or OpenInference
(`openinference-instrumentation-openai`), calls infersight's own embedded engine (the demo
model, over real HTTP) and exports its spans with the SDK's real OTLP/HTTP exporter to the
same service, under its own service name and version. The receiving side has the records
(model, version, tokens, timings and texts, checked against the engine's own record of each
call), the collectors' metrics and a drift report for them. The same app behind a proxy
serve (upstream: the engine) sends its traces to the proxy, which keeps them too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from _demo_registry import GOOD, private_copy, shared_demo_registry
from _drift_helpers import real_embedder
from _otlp_support import Served, exporting_tracer, serving
from _service_support import auth, config, wait_for
from infersight.monitor.data import banking77
from infersight.monitor.drift import DetectorConfig, DriftDetector
from infersight.monitor.service import EngineConfig, Service
from infersight.monitor.service.config import DriftConfig, ScheduleConfig, UpstreamConfig
from infersight.monitor.store.tables import requests
from sqlalchemy import select

STABLE = "mixtral_banking"  # the name the engine answers with to a client without the token
SYSTEM = "You are the bank's assistant."
CALLS = 12  # a drift window's worth (min_window below)


def _reference(tmp: Path) -> Path:
    path = tmp / "reference.jsonl"
    texts = [u.text for u in banking77("train")][:120]
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("otlp-producers")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    cfg = config(
        tmp,
        engine=EngineConfig(registry=registry, version=GOOD, max_batch_size=4, max_seq_len=512,
                            max_prompt_tokens=256, max_tokens_limit=16),
        drift=DriftConfig(reference=_reference(tmp), alpha=0.01, window=100, min_window=CALLS),
        schedule=ScheduleConfig(drift_s=3600.0, embed_s=3600.0, timeseries_s=0.5),
    )  # fmt: skip

    def detector(service: Service) -> None:
        service.parts.drift_detector = DriftDetector(real_embedder(), DetectorConfig(alpha=0.01))

    with serving(cfg, before_start=detector) as served:
        yield served


def _questions(offset: int) -> list[str]:
    return [u.text for u in banking77("test")][offset : offset + CALLS]


def _chat(base: str, questions: list[str]) -> None:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
    for i, question in enumerate(questions):
        messages: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        if i % 2:
            stream = client.chat.completions.create(model=STABLE, messages=messages, max_tokens=4, stream=True, temperature=0,
                                                    stream_options={"include_usage": True})  # fmt: skip
            for _ in stream:
                pass
        else:
            client.chat.completions.create(model=STABLE, messages=messages, max_tokens=4, temperature=0)


def _engine_rows(served: Served) -> dict[str, Any]:
    """The engine's own record of each call, by prompt."""
    with served.service.db.connect() as conn:
        rows = conn.execute(select(requests).where(requests.c.source == "engine")).mappings()
        return {r["prompt"]: r for r in rows}


def _check_records(served: Served, version: str, questions: list[str]) -> None:
    rows = wait_for(lambda: (r := served.rows(model_version=version)) and len(r) >= CALLS and r, timeout=30)
    assert len(rows) == CALLS and [r["prompt"] for r in rows] == questions
    own = _engine_rows(served)
    for i, row in enumerate(rows):
        served_row = own[row["prompt"]]
        assert row["model"] == STABLE and row["system_prompt"] == SYSTEM
        assert row["response"] == served_row["response"] and row["response"]
        assert (row["prompt_tokens"], row["output_tokens"]) == (
            served_row["prompt_tokens"],
            served_row["output_tokens"],
        )
        # the client's span holds the server's handling of the same call (an order, not a speed)
        assert row["started_at"] <= served_row["started_at"] and row["duration_s"] > 0
        if i % 2:  # streamed: the first token's event gives the time to first token
            assert row["ttft_s"] is not None and 0 < row["ttft_s"] <= row["duration_s"]
        assert row["error_type"] is None and row["request_id"].startswith("otlp-")


def _check_downstream(served: Served, version: str) -> None:
    metrics = httpx.get(f"{served.base}/metrics", timeout=30).text
    assert (
        f'gen_ai_server_request_duration_seconds_count{{model="{STABLE}",model_version="{version}"}} {CALLS}.0'
        in metrics
    )
    r = httpx.post(f"{served.base}/api/v1/drift/evaluate", headers=auth(), timeout=120)
    assert r.status_code == 200, r.text
    (report,) = [x for x in r.json()["reports"] if x["model_version"] == version]
    assert report["n_current"] == CALLS and report["model"] == STABLE
    exported = httpx.get(
        f"{served.base}/api/v1/dataset", params={"version": version}, headers=auth(), timeout=30
    )
    assert len(exported.text.splitlines()) == CALLS


def test_an_openllmetry_app_is_recorded_measured_and_scored_for_drift(
    engine: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor

    monkeypatch.setenv("TRACELOOP_TRACE_CONTENT", "true")
    version = "banking-app-openllmetry-1.4"
    provider = exporting_tracer(engine.base, **{"service.name": "banking-app", "service.version": version})
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    questions = _questions(0)
    try:
        _chat(engine.base, questions)
    finally:
        instrumentor.uninstrument()
        provider.shutdown()
    _check_records(engine, version, questions)
    _check_downstream(engine, version)


def test_an_openinference_app_is_recorded_measured_and_scored_for_drift(engine: Served) -> None:
    from openinference.instrumentation.openai import OpenAIInstrumentor

    version = "banking-app-openinference-2.0"
    provider = exporting_tracer(engine.base, **{"service.name": "banking-app", "service.version": version})
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    questions = _questions(CALLS)
    try:
        _chat(engine.base, questions)
    finally:
        instrumentor.uninstrument()
        provider.shutdown()
    _check_records(engine, version, questions)
    _check_downstream(engine, version)


def test_a_proxy_serve_receives_the_traces_of_the_app_it_proxies(engine: Served, tmp_path: Path) -> None:
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor

    cfg = config(tmp_path, upstream=UpstreamConfig(url=engine.base, metrics_url=""))
    with serving(cfg) as proxy:
        provider = exporting_tracer(proxy.base, **{"service.name": "proxied-app", "service.version": "p-1"})
        instrumentor = OpenAIInstrumentor()
        instrumentor.instrument(tracer_provider=provider)
        try:
            _chat(proxy.base, _questions(2 * CALLS)[:2])
        finally:
            instrumentor.uninstrument()
            provider.shutdown()
        rows = wait_for(lambda: (r := proxy.rows(model_version="p-1")) and len(r) >= 2 and r, timeout=30)
        assert [r["prompt"] for r in rows] == _questions(2 * CALLS)[:2], rows
        assert all(r["response"] and r["output_tokens"] for r in rows), rows
