"""The OTLP/HTTP receiver (`POST /v1/traces`) of an ingest-only `infersight serve` (no
engine, no upstream), over real HTTP: spans made by the OpenTelemetry SDK and sent by its
real OTLP/HTTP exporter, or encoded by the SDK's own encoder into protobuf, OTLP/JSON and
gzip bodies. A vLLM server span (vLLM's `SpanAttributes` names) becomes a record; a bad
token is 401, an oversize body 413, a malformed one 400 with a `google.rpc.Status`; a
model-call span without a model is named in `partial_success`; a full write queue is 503
with Retry-After and keeps nothing; the service's text rules (sampling, redaction) apply."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _otlp_support import Served, exporting_tracer, serving
from _service_support import TOKEN, auth, config, wait_for
from google.protobuf import json_format
from google.rpc import status_pb2
from hypothesis import given, settings
from hypothesis import strategies as st
from infersight.monitor.service.config import AlertingConfig, LimitsConfig, ScheduleConfig
from infersight.monitor.service.otlp_spans import REJECT_REASONS, SKIP_REASONS, TextPolicy, records_from_spans
from infersight.monitor.service.routers.otlp import _decode_and_map, _Refused
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

LIMIT = 256 * 1024
PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}

# vLLM's vllm/tracing.py SpanAttributes, by their exact names, as its llm_request span sets them
VLLM = {
    "gen_ai.response.model": "meta-llama/Llama-3.1-8B-Instruct",
    "gen_ai.request.id": "cmpl-9f2c",
    "gen_ai.request.temperature": 0.7,
    "gen_ai.request.top_p": 0.95,
    "gen_ai.request.max_tokens": 128,
    "gen_ai.request.n": 1,
    "gen_ai.usage.num_sequences": 1,
    "gen_ai.usage.prompt_tokens": 17,
    "gen_ai.usage.completion_tokens": 33,
    "gen_ai.latency.time_in_queue": 0.25,
    "gen_ai.latency.time_to_first_token": 0.5,
    "gen_ai.latency.e2e": 2.1,
    "gen_ai.latency.time_in_scheduler": 0.01,
    "gen_ai.latency.time_in_model_forward": 1.2,
    "gen_ai.latency.time_in_model_execute": 1.4,
    "gen_ai.latency.time_in_model_prefill": 0.3,
    "gen_ai.latency.time_in_model_decode": 1.3,
    "gen_ai.latency.time_in_model_inference": 1.6,
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("otlp-receiver")
    with serving(config(tmp, limits=LimitsConfig(max_body_bytes=LIMIT))) as s:
        yield s


def _spans(
    *specs: tuple[str, dict[str, Any]], error: bool = False, resource: dict[str, str] | None = None
) -> list[ReadableSpan]:
    """SDK spans (name, attributes), each lasting 2 s and ended now, read back in memory."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(resource or {}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    now = time.time_ns()
    for name, attributes in specs:
        span = tracer.start_span(
            name, kind=SpanKind.CLIENT, attributes=attributes, start_time=now - 2 * 10**9
        )
        if error:
            span.set_status(Status(StatusCode.ERROR, "boom"))
        span.end(end_time=now)
    return list(memory.get_finished_spans())


def _chat(model: str, prompt: str, answer: str) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model,
        "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": prompt}]}]
        ),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
        ),
    }


def _otlp_json(export: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON as the specification writes it: protobuf's JSON mapping with hex ids."""
    obj = json_format.MessageToDict(export)
    for rs in obj["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(obj).encode()


def _post(served: Served, body: bytes, headers: dict[str, str], token: str | None = TOKEN) -> httpx.Response:
    sent = {**headers, **(auth(token) if token else {})}
    return httpx.post(f"{served.base}/v1/traces", content=body, headers=sent, timeout=30)


def test_a_vllm_server_span_sent_by_the_sdk_exporter_becomes_a_record(served: Served) -> None:
    provider = exporting_tracer(served.base, **{"service.name": "vllm", "service.version": "llama-2025-07"})
    tracer = provider.get_tracer("vllm.engine")
    now = time.time_ns()
    span = tracer.start_span(
        "llm_request", kind=SpanKind.SERVER, attributes=VLLM, start_time=now - 2_100_000_000
    )
    span.end(end_time=now)
    provider.shutdown()
    (row,) = served.rows(model="meta-llama/Llama-3.1-8B-Instruct")
    assert row["model_version"] == "llama-2025-07"  # the span names the model only; the service its version
    assert (row["prompt_tokens"], row["output_tokens"]) == (17, 33)
    assert row["duration_s"] == pytest.approx(2.1) and row["ttft_s"] == pytest.approx(0.5)
    assert row["queue_s"] == pytest.approx(0.25)
    assert row["tpot_s"] == pytest.approx((2.1 - 0.5) / 32)
    assert row["started_at"].timestamp() == pytest.approx((now - 2_100_000_000) / 1e9, abs=1e-3)
    assert row["error_type"] is None and row["source"] == "otlp"
    assert (row["max_tokens"], row["stream"], row["finish_reason"]) == (
        128,
        None,
        None,
    )  # the request's shape


def test_a_spans_max_tokens_and_finish_reason_are_stored(served: Served) -> None:
    provider = exporting_tracer(served.base, **{"service.name": "shape-app"})
    tracer = provider.get_tracer("shape")
    now = time.time_ns()
    for model, extra in (
        ("shape-a", {"gen_ai.request.max_tokens": 64, "gen_ai.response.finish_reasons": ("length",)}),
        ("shape-b", {"gen_ai.request.max_tokens": 0, "gen_ai.response.finish_reasons": ("function_call",),
                     "llm.is_streaming": True}),  # out of range: dropped, the span kept
        ("shape-c", {"llm.invocation_parameters": json.dumps({"max_tokens": 9, "stream": False}),
                     "gen_ai.response.finish_reasons": ("eos_token",)}),
    ):  # fmt: skip
        span = tracer.start_span("chat", kind=SpanKind.CLIENT, attributes={**_chat(model, "hi", "hello"), **extra},
                                 start_time=now - 10**9)  # fmt: skip
        span.end(end_time=now)
    provider.shutdown()
    shapes = {m: [(r["max_tokens"], r["stream"], r["finish_reason"]) for r in served.rows(model=m)]
              for m in ("shape-a", "shape-b", "shape-c")}  # fmt: skip
    assert shapes == {
        "shape-a": [(64, None, "length")],
        "shape-b": [(None, True, "tool_calls")],
        "shape-c": [(9, False, "other")],
    }


def test_protobuf_json_and_gzip_bodies_are_read_alike_and_answered_in_their_format(served: Served) -> None:
    bodies = {}
    for kind in ("protobuf", "json", "gzip-protobuf", "gzip-json"):
        export = encode_spans(_spans(("chat m", _chat(f"fmt-{kind}", f"question {kind}", f"answer {kind}"))))
        raw = _otlp_json(export) if kind.endswith("json") else export.SerializeToString()
        bodies[kind] = (gzip.compress(raw) if kind.startswith("gzip") else raw, export)
    for kind, (body, _) in bodies.items():
        headers = dict(JSON if kind.endswith("json") else PROTOBUF)
        if kind.startswith("gzip"):
            headers["Content-Encoding"] = "gzip"
        r = _post(served, body, headers)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith(headers["Content-Type"])
        if kind.endswith("json"):
            assert r.json() == {}  # a full success: an empty ExportTraceServiceResponse
        else:
            assert ExportTraceServiceResponse.FromString(r.content) == ExportTraceServiceResponse()
    for kind, (_, export) in bodies.items():
        (row,) = served.rows(model=f"fmt-{kind}")
        span = export.resource_spans[0].scope_spans[0].spans[0]
        assert row["request_id"] == f"otlp-{span.trace_id.hex()}-{span.span_id.hex()}"
        assert (row["prompt"], row["response"]) == (f"question {kind}", f"answer {kind}")
        assert (row["prompt_tokens"], row["output_tokens"]) == (7, 3)


def test_an_export_sent_again_is_stored_once(served: Served) -> None:
    body = encode_spans(_spans(("chat", _chat("retried", "q", "a")))).SerializeToString()
    assert [_post(served, body, PROTOBUF).status_code for _ in range(2)] == [200, 200]
    assert len(served.rows(model="retried")) == 1


def test_a_bad_or_missing_token_is_401_with_an_otlp_status_and_nothing_is_kept(served: Served) -> None:
    body = encode_spans(_spans(("chat", _chat("no-token", "q", "a")))).SerializeToString()
    for token in (None, "wrong-token-0123456789"):
        r = _post(served, body, PROTOBUF, token=token)
        assert r.status_code == 401
        assert status_pb2.Status.FromString(r.content).code == 16  # UNAUTHENTICATED
    assert served.rows(model="no-token") == []


def test_an_oversize_body_is_413_declared_or_inflated_from_gzip(served: Served) -> None:
    big = b"\x00" * (LIMIT + 1)
    assert _post(served, big, PROTOBUF).status_code == 413
    bomb = gzip.compress(big)  # a small body that inflates past the limit
    assert len(bomb) < LIMIT
    r = _post(served, bomb, {**PROTOBUF, "Content-Encoding": "gzip"})
    assert r.status_code == 413 and "larger than" in status_pb2.Status.FromString(r.content).message


def test_a_malformed_body_is_400_with_a_google_rpc_status(served: Served) -> None:
    r = _post(served, b"\xff\xff\xff not protobuf", PROTOBUF)
    assert r.status_code == 400
    status = status_pb2.Status.FromString(r.content)
    assert status.code == 3 and "ExportTraceServiceRequest" in status.message  # INVALID_ARGUMENT
    r = _post(served, b'{"resourceSpans": [', JSON)
    assert r.status_code == 400 and r.json()["code"] == 3 and "OTLP/JSON" in r.json()["message"]
    r = _post(served, b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "not-hex"}]}]}]}', JSON)
    assert r.status_code == 400 and "traceId" in r.json()["message"]
    r = _post(served, b"not gzip at all", {**PROTOBUF, "Content-Encoding": "gzip"})
    assert r.status_code == 400 and "gzip" in status_pb2.Status.FromString(r.content).message


def test_a_partial_batch_names_the_rejected_spans_and_keeps_the_rest(served: Served) -> None:
    before = {
        o: served.metric("infersight_otlp_spans_total", outcome=o)
        for o in ("accepted", "no_model", "not_genai")
    }
    spans = _spans(
        ("chat good", _chat("partial-ok", "q", "a")),
        ("chat nameless", {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 3}),
        ("GET /v1/models", {"http.request.method": "GET", "http.response.status_code": 200}),
        ("embeddings", {"gen_ai.operation.name": "embeddings", "gen_ai.request.model": "e5"}),
    )
    r = _post(served, _otlp_json(encode_spans(spans)), JSON)
    assert r.status_code == 200
    partial = r.json()["partialSuccess"]
    assert int(partial["rejectedSpans"]) == 1 and "names no model" in partial["errorMessage"]
    assert [row["model"] for row in served.rows(model="partial-ok")] == ["partial-ok"]
    after = {o: served.metric("infersight_otlp_spans_total", outcome=o) for o in before}
    assert {o: after[o] - before[o] for o in before} == {"accepted": 1, "no_model": 1, "not_genai": 1}
    assert served.metric("infersight_otlp_spans_total", outcome="not_a_generation") >= 1
    registry = served.service.registry  # every reason is a series from the first scrape
    assert all(registry.get_sample_value("infersight_otlp_spans_total", {"outcome": reason}) is not None
               for reason in (*SKIP_REASONS, *REJECT_REASONS))  # fmt: skip


def test_a_failed_call_keeps_its_error_type(served: Served) -> None:
    attrs = {**_chat("failing", "q", ""), "error.type": "openai.InternalServerError"}
    assert _post(
        served, encode_spans(_spans(("chat", attrs), error=True)).SerializeToString(), PROTOBUF
    ).is_success
    client = {**_chat("refused", "q", ""), "error.type": "BadRequestError"}
    assert _post(
        served, encode_spans(_spans(("chat", client), error=True)).SerializeToString(), PROTOBUF
    ).is_success
    assert served.rows(model="failing")[0]["error_type"] == "openai.InternalServerError"
    assert served.rows(model="refused")[0]["error_type"] == "client_error"  # the caller's 4xx, as the proxy


def mask_digits(text: str) -> str:
    return "".join("#" if c.isdigit() else c for c in text)


def test_the_services_text_rules_apply_sampling_and_the_redact_hook(tmp_path: Path) -> None:
    cfg = config(tmp_path / "redact", redact="test_otlp_receiver:mask_digits")
    with serving(cfg) as s:
        body = encode_spans(
            _spans(("chat", _chat("redacted", "card 4111 1111", "call 555")))
        ).SerializeToString()
        assert _post(s, body, PROTOBUF).status_code == 200
        (row,) = s.rows()
        assert (row["prompt"], row["response"]) == ("card #### ####", "call ###")
    with serving(config(tmp_path / "unsampled", text_sample_rate=0.0)) as s:
        body = encode_spans(_spans(("chat", _chat("unsampled", "secret", "secret")))).SerializeToString()
        assert _post(s, body, PROTOBUF).status_code == 200
        (row,) = s.rows()
        assert (row["prompt"], row["response"], row["prompt_tokens"]) == (
            None,
            None,
            7,
        )  # figures kept, text not


def test_a_full_write_queue_is_503_with_retry_after_and_keeps_nothing(tmp_path: Path) -> None:
    cfg = config(tmp_path, limits=dataclasses.replace(LimitsConfig(), write_queue_rows=1))
    with serving(cfg) as s:
        body = encode_spans(_spans(("chat", _chat("a", "q", "a")), ("chat", _chat("b", "q", "a"))))
        r = _post(s, body.SerializeToString(), PROTOBUF)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert status_pb2.Status.FromString(r.content).code == 14  # UNAVAILABLE: exporters retry it
        assert s.rows() == []


def test_a_dated_snapshot_that_answered_is_the_version_of_the_model_asked_for(served: Served) -> None:
    openinference = {  # OpenInference names the model that answered; its invocation parameters the one asked for
        "openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini-2024-07-18",
        "llm.invocation_parameters": json.dumps({"model": "gpt-4o-mini", "temperature": 0}),
        "llm.input_messages.0.message.role": "user", "llm.input_messages.0.message.content": "hello",
        "llm.output_messages.0.message.role": "assistant", "llm.output_messages.0.message.content": "hi",
        "llm.token_count.prompt": 4, "llm.token_count.completion": 1,
    }  # fmt: skip
    body = encode_spans(_spans(("ChatCompletion", openinference), resource={"service.version": "app-3"}))
    assert _post(served, body.SerializeToString(), PROTOBUF).status_code == 200
    (row,) = served.rows(model="gpt-4o-mini")
    assert row["model_version"] == "gpt-4o-mini-2024-07-18"
    assert (row["prompt"], row["response"], row["prompt_tokens"], row["output_tokens"]) == (
        "hello",
        "hi",
        4,
        1,
    )


def test_an_otlp_json_span_without_ids_is_rejected_not_stored_under_a_shared_id(served: Served) -> None:
    now = time.time_ns()
    span = {"name": "chat", "startTimeUnixNano": str(now - 10**9), "endTimeUnixNano": str(now),
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                           {"key": "gen_ai.request.model", "value": {"stringValue": "idless"}}]}  # fmt: skip
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span, span]}]}]}).encode()
    r = _post(served, body, JSON)
    assert r.status_code == 200 and int(r.json()["partialSuccess"]["rejectedSpans"]) == 2
    assert "without a trace id" in r.json()["partialSuccess"]["errorMessage"]
    assert served.rows(model="idless") == []


def test_a_snapshot_holds_the_calls_that_came_over_otlp(served: Served) -> None:
    body = encode_spans(_spans(("chat", _chat("snapshotted", "where is my card", "on its way"))))
    assert _post(served, body.SerializeToString(), PROTOBUF).status_code == 200
    r = httpx.post(f"{served.base}/api/v1/snapshots", json={"reason": "otlp", "requests": 50}, headers=auth(),
                   timeout=60)  # fmt: skip
    assert r.status_code == 201, r.text
    content = httpx.get(
        f"{served.base}/api/v1/snapshots/{r.json()['snapshot_id']}", headers=auth(), timeout=30
    )
    (kept,) = [q for q in content.json()["requests"] if q["model"] == "snapshotted"]
    assert (kept["source"], kept["prompt"], kept["response"]) == ("otlp", "where is my card", "on its way")


ERROR_RULES = """\
groups:
  - name: serving
    interval: 1s
    rules:
      - alert: ErrorRateSpike
        signal: {kind: error_rate, window: 1m, min_requests: 10}
        op: ">"
        threshold: 0.05
        by: [model, model_version]
        labels: {severity: critical}
"""


def test_failing_calls_sent_over_otlp_fire_the_error_rate_alert(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(ERROR_RULES, encoding="utf-8")
    cfg = config(tmp_path, alerting=AlertingConfig(rules=rules),
                 schedule=ScheduleConfig(rules_s=0.2, timeseries_s=0.5))  # fmt: skip
    with serving(cfg) as s:
        ok = _spans(*[("chat", _chat("flaky", "q", "a"))] * 10)
        failed = _spans(
            *[("chat", {**_chat("flaky", "q", ""), "error.type": "InternalServerError"})] * 10, error=True
        )
        assert _post(s, encode_spans(ok + failed).SerializeToString(), PROTOBUF).status_code == 200

        def firing() -> list[Any]:
            alerts = httpx.get(f"{s.base}/api/v1/alerts", params={"state": "firing"}, timeout=30).json()[
                "alerts"
            ]
            return [
                a for a in alerts if a["alertname"] == "ErrorRateSpike" and a["labels"]["model"] == "flaky"
            ]

        (alert,) = wait_for(firing, timeout=30)
        assert alert["value"] == pytest.approx(0.5)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
        ["resourceSpans", "scopeSpans", "spans", "attributes", "key", "value", "stringValue", "intValue",
         "traceId", "spanId", "startTimeUnixNano", "endTimeUnixNano", "status", "code", "events", "x"]
    ), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=300), shaped=_JSON)
def test_no_body_makes_the_receiver_fail_with_a_5xx(raw: bytes, shaped: Any) -> None:
    # what the route runs on a body (routers/otlp.py): an export's records, or a 4xx refusal
    body = json.dumps({"resourceSpans": [shaped]}).encode()
    for content, media in (
        (raw, "application/x-protobuf"),
        (body, "application/json"),
        (raw, "application/json"),
    ):
        try:
            _decode_and_map(content, "identity", media, LIMIT, TextPolicy())
        except _Refused as exc:
            assert exc.status == 400


_KEYS = ["gen_ai.operation.name", "gen_ai.request.model", "gen_ai.response.model", "llm.model_name",
         "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.usage.prompt_tokens",
         "gen_ai.latency.e2e", "gen_ai.latency.time_to_first_token", "gen_ai.latency.time_in_queue",
         "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions", "error.type",
         "gen_ai.response.finish_reasons", "gen_ai.prompt.0.content", "gen_ai.prompt.0.role",
         "llm.input_messages.0.message.content", "llm.output_messages.1.message.contents.0.message_content.text",
         "llm.invocation_parameters", "input.value", "input.mime_type", "output.value", "output.mime_type",
         "openinference.span.kind", "llm.request.type", "llm.token_count.prompt"]  # fmt: skip
_SCALAR = (st.text(max_size=12) | st.sampled_from(["chat", "LLM", "application/json", "[{}]", '{"model": 1}',
           '[{"role": "user", "parts": [{"type": "text", "content": 5}]}]', "[1, [2]]"])
           | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.booleans())  # fmt: skip


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@settings(max_examples=300, deadline=None)
@given(attributes=st.dictionaries(st.sampled_from(_KEYS), st.one_of(_SCALAR, st.lists(_SCALAR, max_size=3))),
       times=st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), error=st.booleans())  # fmt: skip
def test_no_span_content_makes_the_mapping_raise(
    attributes: dict[str, Any], times: tuple[int, int], error: bool
) -> None:
    export = ExportTraceServiceRequest()
    span = export.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id = b"\x01" * 16, b"\x02" * 8
    span.start_time_unix_nano, span.end_time_unix_nano = times
    span.status.code = 2 if error else 0
    for key, value in attributes.items():
        kv = span.attributes.add(key=key)
        for v in value if isinstance(value, list) else [value]:
            target = kv.value.array_value.values.add() if isinstance(value, list) else kv.value
            if isinstance(v, bool):
                target.bool_value = v
            elif isinstance(v, int):
                target.int_value = v
            elif isinstance(v, float):
                target.double_value = v
            else:
                target.string_value = v
    handler = _Kept()
    logger = logging.getLogger("infersight.monitor.service.otlp_spans")
    logger.addHandler(handler)
    try:
        batch = records_from_spans(export, TextPolicy())
    finally:
        logger.removeHandler(handler)
    assert len(batch.records) + sum(batch.skipped.values()) + batch.rejected_spans == 1
    assert handler.records == []  # every shape is foreseen: rejected by reason, not by the safety net
