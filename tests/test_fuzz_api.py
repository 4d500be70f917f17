"""Property-based fuzzing of the whole HTTP API from its own OpenAPI schema (schemathesis):
valid and invalid requests to every operation, with and without the token, against a
fully wired service (embedded runtime with the demo model, alerts, drift). No request may
produce a 5xx. The number of cases is printed and asserted, and recorded in docs/benchmarks.md."""

from __future__ import annotations

import collections

import pytest
import schemathesis
from _demo_registry import GOOD, private_copy, shared_demo_registry
from _service_support import TOKEN, config
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from infersight.monitor.service import EngineConfig, create_app
from infersight.monitor.service.config import DriftConfig, LimitsConfig, ScheduleConfig
from schemathesis import GenerationMode

EXAMPLES = 20  # per operation, per mode, per token state


@pytest.fixture(scope="module")
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
