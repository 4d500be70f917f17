"""Property-based fuzzing of the whole HTTP API from its own OpenAPI schema (schemathesis):
valid and invalid requests to every operation, with and without the token, against a
fully wired service (embedded runtime with the demo model, alerts, drift). No request may
produce a 5xx. Every route the app answers is fuzzed: the one outside the OpenAPI document
(OTLP's `/v1/traces`, protobuf) with random bytes and export-shaped JSON. The number of cases is printed and asserted, and recorded in docs/benchmarks/ingest.md."""

from __future__ import annotations

import collections
import gzip
import json
from typing import Any
from urllib.parse import quote

import pytest
import schemathesis
from _demo_registry import GOOD, private_copy, shared_demo_registry
from _service_support import TOKEN, config
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from infersight.monitor.service import EngineConfig, create_app
from infersight.monitor.service.config import DriftConfig, LimitsConfig, ScheduleConfig
from schemathesis import GenerationMode

EXAMPLES = 20  # per operation, per mode, per token state


@pytest.fixture  # one service per test: schemathesis' own ASGI client runs the app's lifespan
def app(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("fuzz")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    cfg = config(
        tmp,
        engine=EngineConfig(
            registry=registry,
            version=GOOD,
            max_batch_size=4,
            max_seq_len=256,
            max_prompt_tokens=128,
            max_tokens_limit=16,
        ),
        drift=DriftConfig(enabled=True),
        schedule=ScheduleConfig(timeseries_s=0.5, embed_s=3600.0, drift_s=3600.0),
        limits=LimitsConfig(max_body_bytes=256 * 1024),
    )
    application = create_app(cfg)
    with TestClient(application, raise_server_exceptions=False) as client:
        yield application, client


def test_no_request_makes_the_service_answer_5xx(app) -> None:  # type: ignore[no-untyped-def]
    app, client = app
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    counts: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20, [op.label for op in operations]

    def fuzz(operation, mode, headers):  # type: ignore[no-untyped-def]
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        def run(case) -> None:  # type: ignore[no-untyped-def]
            # schemathesis builds the request; the app's own TestClient sends it (its bundled
            # requests-based ASGI transport does not run with the urllib3 installed here)
            kw = case.as_transport_kwargs(base_url="http://testserver", headers=headers)
            body = {k: kw[k] for k in ("json", "data", "content") if k in kw}
            if "data" in body and not isinstance(body["data"], dict):
                body = {"content": body.pop("data")}
            response = client.request(kw["method"], kw["url"], headers=kw.get("headers"),
                                      params=kw.get("params"), **body)  # fmt: skip
            counts[str(response.status_code)] += 1
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
                )

        try:
            run()
        except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
            assert mode is GenerationMode.NEGATIVE, operation.label
            no_negative.add(operation.label)

    no_negative: set[str] = set()
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for headers in ({"Authorization": f"Bearer {TOKEN}"}, {}):
                fuzz(operation, mode, headers)
    total = sum(counts.values())
    print(
        f"\nfuzzed {len(operations)} operations with {total} cases; statuses: {dict(sorted(counts.items()))}"
    )
    assert not failures, "\n".join(failures[:10])
    print(f"no invalid request exists for: {sorted(no_negative)}")
    assert total >= len(operations) * EXAMPLES
    assert not any(code.startswith("5") for code in counts)


HOSTILE = ["99999999999d", "9" * 400 + "w", "²", "1e309", "-1", "NaN", "0001-01-01T00:00:00+01:00",
           "\u0000", "x" * 5000, "mixtral_banking_fp32-v1.0\n", "../../etc/passwd", "%00"]  # fmt: skip
HOSTILE_BODIES = [b"[" * 50_000 + b"]" * 50_000, b'{"a":' * 20_000 + b"1" + b"}" * 20_000, b'"\xff"',
                  b'{"version": "\\u00b2", "weight": 1e999, "requests": "\\u00b2"}', b"1" * 5000]  # fmt: skip


def test_known_hostile_values_in_every_parameter_and_body_get_no_5xx(app) -> None:  # type: ignore[no-untyped-def]
    """Values that once made a route answer 500 (a duration past year 1, '²' read as a digit,
    [[[...]]] nested past the recursion limit, a name with a trailing newline), put in every
    query and path parameter and as the body of every operation that takes one, with the token."""
    app, client = app
    headers = {"Authorization": f"Bearer {TOKEN}"}
    failures: list[str] = []
    sent = 0
    for path, item in app.openapi()["paths"].items():
        for method, op in item.items():
            params = [p for p in op.get("parameters", []) if p["in"] in ("query", "path")]
            required = {p["name"]: "1" for p in params if p.get("required") and p["in"] == "query"}
            cases: list[tuple[str, dict[str, str], bytes | None]] = []
            for p in params:
                for value in HOSTILE:
                    if p["in"] == "path":
                        cases.append(
                            (path.replace("{" + p["name"] + "}", quote(value, safe="")), required, None)
                        )
                    else:
                        cases.append((path, {**required, p["name"]: value}, None))
            if "requestBody" in op:
                cases += [(path, required, body) for body in HOSTILE_BODIES]
            for url, query, body in cases:
                url = url if "{" not in url else url.replace("{", "").replace("}", "")
                r = client.request(method.upper(), url, params=query, content=body,
                                   headers={**headers, "content-type": "application/json"})  # fmt: skip
                sent += 1
                if r.status_code >= 500:
                    failures.append(
                        f"{method.upper()} {url} {query} {(body or b'')[:40]!r} -> {r.status_code} {r.text[:120]}"
                    )
    print(f"\nsent {sent} hostile requests")
    assert sent >= 150
    assert not failures, "\n".join(failures[:20])


def _routes(routes: list[Any]) -> set[tuple[str, str]]:
    """Every (path, method) the app answers, through the routers it includes."""
    out: set[tuple[str, str]] = set()
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            out |= _routes(inner.routes)
        elif getattr(route, "methods", None):
            out |= {(route.path, m) for m in route.methods if m != "HEAD"}
    return out


# routes outside the OpenAPI document, fuzzed below: OTLP's receiver takes protobuf
OUTSIDE_THE_SCHEMA = {("/v1/traces", "POST")}
DOCUMENTATION = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/"}


def test_every_route_is_fuzzed(app) -> None:  # type: ignore[no-untyped-def]
    app, _ = app
    documented = {(p, m.upper()) for p, item in app.openapi()["paths"].items() for m in item}
    answered = {(p, m) for p, m in _routes(app.router.routes) if p not in DOCUMENTATION}
    assert answered - documented == OUTSIDE_THE_SCHEMA


def test_no_otlp_body_makes_the_receiver_answer_5xx(app) -> None:  # type: ignore[no-untyped-def]
    """`/v1/traces` is outside the OpenAPI document: random bytes, and random JSON shaped like
    an export, in both of its formats, plain and gzip, with the token."""
    _, client = app
    counts: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    shaped = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
            ["resourceSpans", "scopeSpans", "spans", "attributes", "key", "value", "stringValue", "traceId",
             "spanId", "startTimeUnixNano", "endTimeUnixNano", "kvlistValue", "values"]), inner, max_size=3),
        max_leaves=12,
    )  # fmt: skip

    @given(raw=st.binary(max_size=200), obj=shaped, gz=st.booleans())
    @settings(max_examples=EXAMPLES * 2, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def run(raw: bytes, obj: Any, gz: bool) -> None:
        for media, body in (("application/x-protobuf", raw), ("application/json", raw),
                            ("application/json", json.dumps({"resourceSpans": [obj]}).encode())):  # fmt: skip
            headers = {"Authorization": f"Bearer {TOKEN}", "content-type": media}
            if gz:
                body, headers["content-encoding"] = gzip.compress(body), "gzip"
            r = client.post("/v1/traces", content=body, headers=headers)
            counts[str(r.status_code)] += 1
            if r.status_code >= 500:
                failures.append(f"{media} {body[:60]!r} -> {r.status_code} {r.text[:200]}")

    run()
    print(f"\nfuzzed /v1/traces with {sum(counts.values())} bodies; statuses: {dict(sorted(counts.items()))}")
    assert not failures, "\n".join(failures[:10])
    assert sum(counts.values()) >= EXAMPLES * 2 * 3
