"""A hand-written corpus of hostile bodies, as an attacker with the token sends them: wrong
types in every field (lists and objects where a string goes, booleans, numbers past any
range), nesting to 100,000 levels, NaN and Infinity, invalid UTF-8, lone surrogates,
truncated and malformed compression. Sent to `/api/v1/events`, `/v1/traces` (protobuf and
JSON), the OpenAI routes and every state-changing route of a fully wired service (embedded
runtime with the demo model): none may answer 5xx. A bad event is refused alone, by index
and field, and the rest of its batch is kept; every OTLP error is a `google.rpc.Status`; an
error answer keeps the connection open for the next request."""

from __future__ import annotations

import base64
import gzip
import json
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _demo_registry import GOOD, private_copy, shared_demo_registry
from _otlp_support import Served, serving
from _service_support import TOKEN, auth, config, event
from fastapi import FastAPI
from fastapi.testclient import TestClient
from google.protobuf import json_format
from google.rpc import status_pb2
from infersight.monitor.service import EngineConfig, create_app
from infersight.monitor.service.config import DriftConfig, LimitsConfig, ScheduleConfig
from infersight.monitor.store.tables import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import select

LIMIT = 1024 * 1024
DEEP = 100_000
NAN = float("nan")
# values that are the wrong type, shape or size for every field of every body
VALUES: list[Any] = [None, True, 0, -1, 2**63, 10**30, 1e308, -1e308, NAN, float("inf"), float("-inf"),
                     "", "\u0000", "\u00b2", "\ud800", "x" * 5000, [], {}, [["x"]], {"a": {"b": [1]}}, [None] * 3]  # fmt: skip
RAW_BODIES = [b"[" * DEEP + b"]" * DEEP, b'{"a":' * DEEP + b"1" + b"}" * DEEP, b'{"x": "\xff\xfe"}',
              b'{"x": "\\ud800"}', b'{"\\ud800": 1}', b'{"events": [{"\\ud800": 1}], "\\udfff": 0}', b'{"x": NaN, "y": -Infinity}', b'{"events": [', b"", b"\x00" * 64,
              b"\x1f\x8b\x08\x00garbage", gzip.compress(b'{"events": []}')[:12], b"1e99999",
              b"9" * 5000]  # fmt: skip


def _with(body: dict[str, Any], field: str, value: Any) -> bytes:
    # Python's json writes NaN and Infinity as bare words, as a careless client does
    return json.dumps({**body, field: value}).encode()


def _holed(body: dict[str, Any], field: str, raw: bytes) -> bytes:
    """`body` as JSON with `raw` (JSON text, any depth) as `field`'s value."""
    return json.dumps({**body, field: "\u2400hole"}).encode().replace(b'"\\u2400hole"', raw)


def _deep_value() -> bytes:
    return b"[" * DEEP + b"]" * DEEP


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FastAPI, TestClient]]:
    tmp = tmp_path_factory.mktemp("hostile")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    cfg = config(
        tmp,
        engine=EngineConfig(
            registry=registry,
            version=GOOD,
            max_batch_size=4,
            max_seq_len=256,
            max_prompt_tokens=128,
            max_tokens_limit=4,
        ),
        limits=LimitsConfig(max_body_bytes=LIMIT, client_rate=0.0),
        drift=DriftConfig(enabled=True),  # its routes answer 503 while drift is off
        schedule=ScheduleConfig(timeseries_s=0.5, embed_s=3600.0, drift_s=3600.0),
    )
    app = create_app(cfg)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield app, c


def _post(c: TestClient, path: str, body: bytes, **headers: str) -> httpx.Response:
    return c.post(path, content=body, headers={**auth(), "content-type": "application/json", **headers})


def _no_5xx(answers: list[tuple[str, httpx.Response]]) -> None:
    print(f"\nsent {len(answers)} hostile requests")
    bad = [f"{what} -> {r.status_code} {r.text[:160]}" for what, r in answers if r.status_code >= 500]
    assert not bad, "\n".join(bad[:15])


# -- /api/v1/events ----------------------------------------------------------------------
FIELDS = ["request_id", "model", "model_version", "started_at", "duration_s", "ttft_s", "tpot_s", "queue_s",
          "prompt_tokens", "output_tokens", "error_type", "prompt", "response", "source", "path",
          "system_prompt", "max_tokens", "stream", "finish_reason"]  # fmt: skip


def test_a_bad_value_in_any_event_field_is_refused_alone_by_index_and_field(client) -> None:  # type: ignore[no-untyped-def]
    _, c = client
    answers = []
    for field in FIELDS:
        # one batch per field: a good event, one event per hostile value, a good event
        events = [json.dumps(event(0)).encode()]
        events += [_holed(event(i + 1), field, json.dumps(v).encode()) for i, v in enumerate(VALUES)]
        events.append(json.dumps(event(len(VALUES) + 1)).encode())
        r = _post(c, "/api/v1/events", b'{"events": [' + b",".join(events) + b"]}")
        answers.append((f"events {field}", r))
        assert r.status_code == 200, (field, r.text[:300])
        answer = r.json()
        assert {x["field"] for x in answer["rejected"]} <= {field}, answer  # each refused by its own field
        refused = [x["index"] for x in answer["rejected"]]
        assert 0 not in refused and len(events) - 1 not in refused  # the good ones are kept
        assert answer["accepted"] + len(refused) == len(events)
        assert len(refused) >= 10, (field, answer)  # most of the corpus is wrong for any field
        # nested past the parser's recursion limit: the body is no JSON to read, a 422 for the body
        deep = _post(c, "/api/v1/events", b'{"events": [' + _holed(event(0), field, _deep_value()) + b"]}")
        answers.append((f"events {field}=deep", deep))
        assert deep.status_code == 422 and deep.json()["error"]["field"] == "body"
    _no_5xx(answers)


def test_an_unhashable_finish_reason_is_refused_by_field_not_a_500(client) -> None:  # type: ignore[no-untyped-def]
    _, c = client
    for value in (["stop"], {"reason": "stop"}):
        body = json.dumps({"events": [event(0, finish_reason=value), event(1)]}).encode()
        r = _post(c, "/api/v1/events", body)
        assert r.status_code == 200
        assert r.json()["accepted"] == 1
        assert r.json()["rejected"][0]["index"] == 0 and r.json()["rejected"][0]["field"] == "finish_reason"


def test_durations_and_counts_past_the_configured_maximum_are_refused_by_field(client) -> None:  # type: ignore[no-untyped-def]
    _, c = client
    cases = [("duration_s", 2.0**64), ("ttft_s", 86_400.5), ("queue_s", 1e300), ("prompt_tokens", 10_000_001),
             ("output_tokens", 2**40), ("max_tokens", 2**31), ("duration_s", NAN), ("tpot_s", float("inf"))]  # fmt: skip
    body = json.dumps({"events": [event(i, **{f: v}) for i, (f, v) in enumerate(cases)] + [event(99)]})
    r = _post(c, "/api/v1/events", body.encode())
    assert r.status_code == 200
    assert r.json()["accepted"] == 1
    assert [(x["index"], x["field"]) for x in r.json()["rejected"]] == [
        (i, f) for i, (f, _) in enumerate(cases)
    ]


def test_a_lone_surrogate_in_an_event_is_refused_by_field(client) -> None:  # type: ignore[no-untyped-def]
    _, c = client
    good = json.dumps(event(0)).encode()
    bad = json.dumps(event(1, prompt="PLACEHOLDER")).encode().replace(b"PLACEHOLDER", b"\\ud800 hi")
    r = _post(c, "/api/v1/events", b'{"events": [' + good + b"," + bad + b"]}")
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": 1, "rejected": [{"index": 1, "field": "prompt", "reason": r.json()["rejected"][0]["reason"]}]}  # fmt: skip


def test_raw_bodies_to_every_state_changing_route_get_no_5xx(client) -> None:  # type: ignore[no-untyped-def]
    app, c = client
    answers = []
    for path, method in _state_changing(app):
        for body in RAW_BODIES:
            for encoding in ("identity", "gzip"):
                r = c.request(method, path.replace("{", "").replace("}", ""), content=body,
                              headers={**auth(), "content-type": "application/json",
                                       "content-encoding": encoding})  # fmt: skip
                answers.append((f"{method} {path} {body[:30]!r} {encoding}", r))
    assert len(answers) >= 10 * len(RAW_BODIES) * 2
    _no_5xx(answers)


def _state_changing(app: FastAPI) -> list[tuple[str, str]]:
    routes = [(p, m.upper()) for p, item in app.openapi()["paths"].items() for m in item if m != "get"]
    return [*routes, ("/v1/traces", "POST")]


def _properties(app: FastAPI, operation: dict[str, Any]) -> list[str]:
    schema = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    if "$ref" in schema:
        schema = app.openapi()["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return sorted(schema.get("properties", {}))


def test_wrong_types_in_every_field_of_every_state_changing_route_get_no_5xx(client) -> None:  # type: ignore[no-untyped-def]
    app, c = client
    answers = []
    covered = 0
    for path, item in app.openapi()["paths"].items():
        for method, operation in item.items():
            if method == "get" or path == "/api/v1/events":
                continue
            names = _properties(app, operation)
            covered += bool(names)
            url = path.replace("{", "").replace("}", "")
            for name in names:
                for value in VALUES:
                    answers.append((f"{method} {path} {name}={str(value)[:30]}",
                                    c.request(method.upper(), url, content=_with({}, name, value),
                                              headers={**auth(), "content-type": "application/json"})))  # fmt: skip
                deep = _holed({}, name, _deep_value())
                answers.append((f"{method} {path} {name}=deep", c.request(method.upper(), url, content=deep,
                                headers={**auth(), "content-type": "application/json"})))  # fmt: skip
    assert covered >= 7  # the OpenAI routes, silences, deploys, canary, rollback, failover...
    _no_5xx(answers)


# -- the OpenAI routes --------------------------------------------------------------------
CHAT = {"model": GOOD, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
COMPLETION = {"model": GOOD, "prompt": "hi", "max_tokens": 1}
# what the routes read, and two they do not (ignored, as OpenAI's own clients may send them)
OPENAI_FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                 "stream", "stream_options", "stop", "n", "seed", "user", "echo", "tools", "logit_bias"]  # fmt: skip
MESSAGES = [[{"role": "user", "content": v}] for v in ([], {}, [{"type": "text", "text": 1}], None, 5)] + [
    [{"role": ["user"], "content": "hi"}], [{"content": "hi"}], ["hi"], [[]], [{"role": "user"}]]  # fmt: skip


def test_wrong_types_in_every_field_of_the_openai_routes_get_no_5xx(client) -> None:  # type: ignore[no-untyped-def]
    _, c = client
    answers = []
    for path, base in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        for field in OPENAI_FIELDS:
            for value in VALUES:
                answers.append(
                    (f"{path} {field}={str(value)[:30]}", _post(c, path, _with(base, field, value)))
                )
            deep = _holed(base, field, _deep_value())
            answers.append((f"{path} {field}=deep", _post(c, path, deep)))
        for messages in MESSAGES:
            answers.append((f"{path} messages={messages}", _post(c, path, _with(base, "messages", messages))))
        for body in RAW_BODIES:
            answers.append((f"{path} {body[:30]!r}", _post(c, path, body)))
    assert len(answers) > 700
    _no_5xx(answers)


# -- /v1/traces ---------------------------------------------------------------------------
JSON_ATTRIBUTES = ("llm.invocation_parameters", "gen_ai.system_instructions", "gen_ai.input.messages",
                   "gen_ai.output.messages", "input.value", "output.value")  # fmt: skip


def _export(attributes: dict[str, str], span_id: int = 1) -> ExportTraceServiceRequest:
    export = ExportTraceServiceRequest()
    span = export.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id = b"\x07" * 16, span_id.to_bytes(8, "big")
    now = time.time_ns()
    span.start_time_unix_nano, span.end_time_unix_nano = now - 10**9, now
    span.name = "chat"
    for key, value in {"gen_ai.operation.name": "chat", "gen_ai.request.model": "deep-json",
                       "input.mime_type": "application/json", "output.mime_type": "application/json",
                       **attributes}.items():  # fmt: skip
        span.attributes.add(key=key).value.string_value = value
    return export


def _otlp_json(export: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON: protobuf's JSON mapping with the ids in hex."""
    obj = json_format.MessageToDict(export)
    for rs in obj["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                span["traceId"], span["spanId"] = (
                    base64.b64decode(span[k]).hex() for k in ("traceId", "spanId")
                )
    return json.dumps(obj).encode()


def _status(r: httpx.Response) -> status_pb2.Status:
    if r.headers["content-type"].startswith("application/json"):
        return json_format.Parse(r.text, status_pb2.Status())
    return status_pb2.Status.FromString(r.content)


def test_json_attributes_nested_100000_levels_deep_keep_the_span(client) -> None:  # type: ignore[no-untyped-def]
    _, c = client
    for i, key in enumerate(JSON_ATTRIBUTES):
        for opening in ("[", '{"a":'):
            nested = opening * DEEP
            export = _export({key: nested + ("1" + "}" * DEEP if opening != "[" else "]" * DEEP)}, i + 1)
            for media, body in (("application/x-protobuf", export.SerializeToString()),
                                ("application/json", _otlp_json(export))):  # fmt: skip
                r = c.post("/v1/traces", content=body, headers={**auth(), "content-type": media})
                assert r.status_code == 200, (key, media, r.status_code, r.text[:200])


def test_a_lone_surrogate_in_a_json_attribute_drops_the_text_and_the_span_is_stored(client) -> None:  # type: ignore[no-untyped-def]
    app, c = client
    messages = '[{"role": "user", "parts": [{"type": "text", "content": "\\ud800 hi"}]}]'  # valid JSON text
    export = _export({"gen_ai.input.messages": messages, "gen_ai.request.model": "surrogate-text"}, 99)
    r = c.post(
        "/v1/traces",
        content=export.SerializeToString(),
        headers={**auth(), "content-type": "application/x-protobuf"},
    )
    assert r.status_code == 200, r.text
    service = app.state.service
    assert service.writer.flush()
    with service.db.connect() as conn:
        rows = list(
            conn.execute(
                select(requests.c.model, requests.c.prompt).where(requests.c.model == "surrogate-text")
            )
        )
    assert [tuple(row) for row in rows] == [
        ("surrogate-text", None)
    ]  # stored, without a text no store can encode
    assert not service.registry.get_sample_value("infersight_store_write_errors_total")


def test_every_otlp_refusal_is_a_google_rpc_status_in_the_requests_format(client) -> None:  # type: ignore[no-untyped-def]
    _, c = client
    good = _export({}).SerializeToString()
    nested = b""
    for _ in range(2000):  # AnyValue.kvlist_value nested 2,000 deep, past protobuf's recursion limit
        nested = b"\x32" + _varint(len(nested) + 2) + b"\x0a" + _varint(len(nested)) + nested
    cases: list[tuple[str, bytes, dict[str, str], int]] = [
        ("bad gzip", b"\x1f\x8b\x08\x00garbage", {"content-encoding": "gzip"}, 400),
        ("truncated gzip", gzip.compress(good)[:-6], {"content-encoding": "gzip"}, 400),
        ("gzip and more", gzip.compress(good) + b"tail", {"content-encoding": "gzip"}, 400),
        ("empty gzip", b"", {"content-encoding": "gzip"}, 400),
        ("bad deflate", b"\x78\x9c garbage", {"content-encoding": "deflate"}, 400),
        ("truncated deflate", zlib.compress(good)[:-3], {"content-encoding": "deflate"}, 400),
        ("unknown encoding", good, {"content-encoding": "br"}, 415),
        ("no token", good, {"authorization": "Bearer wrong-token"}, 401),
        ("too large", b"\x00" * (LIMIT + 1), {}, 413),
        ("deep protobuf", nested, {}, 400),
        ("deep JSON body", b"[" * DEEP + b"]" * DEEP, {}, 400),
        ("invalid UTF-8", b'{"resourceSpans": "\xff"}', {}, 400),
        ("NaN", b'{"resourceSpans": NaN}', {}, 400),
        ("a lone surrogate key", b'{"\\ud800": 1}', {}, 400),  # protobuf's JSON parser failed on it
        (
            "a lone surrogate id",
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "\\udfff"}]}]}]}',
            {},
            400,
        ),
    ]
    for media in ("application/x-protobuf", "application/json"):
        for what, body, headers, expected in cases:
            sent = {"authorization": f"Bearer {TOKEN}", "content-type": media, **headers}
            r = c.post("/v1/traces", content=body, headers=sent)
            assert r.status_code == expected, (what, media, r.status_code, r.text[:200])
            assert r.headers["content-type"].startswith(media), (what, media, r.headers["content-type"])
            status = _status(r)
            assert status.code != 0 and status.message, (what, media)
        r = c.get("/v1/traces", headers={"content-type": media})  # a wrong method: the edge answers
        assert (
            r.status_code in (404, 405) and r.headers["content-type"].startswith(media) and _status(r).message
        )


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


# -- one connection, an error, then a good request ----------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp: Path = tmp_path_factory.mktemp("hostile-served")
    with serving(config(tmp, limits=LimitsConfig(max_body_bytes=LIMIT))) as s:
        yield s


def _peer(r: httpx.Response) -> Any:
    return r.extensions["network_stream"].get_extra_info("client_addr")


def test_an_error_answer_keeps_the_connection_for_the_next_request(served: Served) -> None:
    good = _export({}, 77).SerializeToString()
    proto = {**auth(TOKEN), "content-type": "application/x-protobuf"}
    errors = [
        ("/v1/traces", b"\x1f\x8b\x08\x00garbage", {**proto, "content-encoding": "gzip"}, 400),
        ("/v1/traces", b"\xff\xff not protobuf", proto, 400),
        ("/v1/traces", good, {"content-type": "application/x-protobuf"}, 401),
        ("/v1/traces", _export({"gen_ai.input.messages": "[" * 1000}).SerializeToString(), proto, 200),
        ("/api/v1/events", json.dumps({"events": [event(0, finish_reason=["stop"])]}).encode(),
         {**auth(TOKEN), "content-type": "application/json"}, 200),
        ("/api/v1/events", b"[" * DEEP, {**auth(TOKEN), "content-type": "application/json"}, 422),
    ]  # fmt: skip
    with httpx.Client(base_url=served.base, timeout=30) as http:
        for path, body, headers, expected in errors:
            bad = http.post(path, content=body, headers=headers)
            assert bad.status_code == expected, (path, bad.text[:200])
            ok = http.post("/v1/traces", content=good, headers=proto)
            assert ok.status_code == 200
            assert _peer(ok) is not None and _peer(ok) == _peer(bad), (
                f"{path} {expected}: the server closed it"
            )


def test_the_rate_limits_429_on_otlp_is_a_status_too(tmp_path: Path) -> None:
    cfg = config(tmp_path, limits=LimitsConfig(client_rate=1.0, client_burst=1.0))
    app = create_app(cfg)
    with TestClient(app, raise_server_exceptions=False) as c:
        answers = [c.post("/v1/traces", content=b"", headers={"content-type": "application/x-protobuf"})
                   for _ in range(3)]  # fmt: skip
    limited = [r for r in answers if r.status_code == 429]
    assert limited and limited[0].headers["content-type"] == "application/x-protobuf"
    assert _status(limited[0]).code == 8 and "retry-after" in limited[0].headers
