"""SLA routing in `infersight serve` (the real app in-process, the demo model): the
`routing:` config checked at start naming the key, records and /metrics by path, and the
length breaker under a flood of long prompts: it opens, short requests are never shed,
long ones get 503 + Retry-After, and it closes by itself after the flood."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _demo_registry import GOOD, private_copy, shared_demo_registry
from _service_support import auth, config, wait_for
from fastapi.testclient import TestClient
from infersight.monitor.service import ConfigInvalid, create_app
from infersight.monitor.service.config import config_from_mapping
from infersight.monitor.store.tables import requests
from sqlalchemy import select

INT8 = "mixtral_banking_int8-v1.0"
SHORT = "Where is my new card? It has not arrived."
LONG = " ".join(
    ["I was charged twice for one purchase, my card was declined at a shop and the app shows an error."] * 10
)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return private_copy(shared_demo_registry(tmp_path_factory), tmp_path_factory.mktemp("rsvc") / "registry")


def _mapping(registry: Path, **routing: object) -> dict[str, object]:
    section: dict[str, object] = {
        "fast": {"version": INT8, "sla_ms": 100, "max_prompt_tokens": 32, "max_new_tokens": 8},
        "standard": {"version": GOOD, "sla_ms": 250},
    }
    section.update(routing)
    return {"engine": {"registry": str(registry), "max_seq_len": 512}, "routing": section}


@pytest.mark.parametrize(
    ("routing", "key"),
    [
        ({"fast": {"version": "mixtral_banking_int8-v9.9", "sla_ms": 50}}, "routing.fast.version"),
        ({"standard": {"version": GOOD, "sla_ms": 0}}, "routing.standard.sla_ms"),
        ({"fast": {"version": INT8, "sla_ms": -5}}, "routing.fast.sla_ms"),
        ({"classifier": "no_such_module_here:classify"}, "routing.classifier"),
        ({"classifier": "os.path"}, "routing.classifier"),
        ({"breaker_action": "drop"}, "routing.breaker_action"),
        ({"fast": {"version": INT8}}, "routing.fast.sla_ms"),
        ({"fast": {"version": INT8, "sla_ms": 50, "speed": "max"}}, "routing.fast.speed"),
    ],
)
def test_a_bad_routing_config_is_refused_naming_the_key(registry: Path, routing: dict, key: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigInvalid) as refused:
        config_from_mapping(_mapping(registry, **routing))
    assert refused.value.field == key


def test_an_unloadable_fast_version_refuses_the_start_naming_the_key(tmp_path: Path, registry: Path) -> None:
    import dataclasses
    import json
    import shutil

    broken = private_copy(registry, tmp_path / "broken")
    checkpoint = tmp_path / "int8-checkpoint"
    meta = broken / INT8 / "version.json"
    info = json.loads(meta.read_text())
    shutil.copytree(info["path"], checkpoint)
    meta.write_text(json.dumps({**info, "path": str(checkpoint)}))
    (checkpoint / "model.safetensors").write_bytes(b"not the weights")  # the sha256 no longer matches
    cfg = config_from_mapping(_mapping(broken))
    cfg = dataclasses.replace(config(tmp_path), engine=cfg.engine, routing=cfg.routing)
    with pytest.raises(ConfigInvalid) as refused, TestClient(create_app(cfg)):
        pass
    assert refused.value.field == "routing.fast.version"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, registry: Path) -> Iterator[tuple[object, TestClient]]:
    import dataclasses

    tmp = tmp_path_factory.mktemp("routed")
    # the standard SLA out of reach (1 ms): every long request misses it, on any machine
    parsed = config_from_mapping(_mapping(registry, breaker_cooldown_s=6.0,
                                          standard={"version": GOOD, "sla_ms": 1}))  # fmt: skip
    engine = dataclasses.replace(parsed.engine, max_batch_size=8, max_prompt_tokens=400, max_tokens_limit=64)  # type: ignore[arg-type]
    cfg = dataclasses.replace(config(tmp), engine=engine, routing=parsed.routing)
    app = create_app(cfg)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield app, client


def _ask(client: TestClient, prompt: str, max_tokens: int) -> tuple[int, float, dict[str, str]]:
    t0 = time.perf_counter()
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens}, headers=auth())
    return r.status_code, time.perf_counter() - t0, dict(r.headers)


def _metric(client: TestClient, line_start: str) -> float | None:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_requests_are_routed_by_length_and_records_and_metrics_carry_the_path(served) -> None:  # type: ignore[no-untyped-def]
    app, client = served
    assert _ask(client, SHORT, 4)[0] == 200
    assert _ask(client, LONG, 4)[0] == 200
    service = app.state.service  # type: ignore[attr-defined]
    text = client.get("/metrics").text
    assert 'infersight_route_requests_total{path="fast",reason="short"}' in text
    assert 'infersight_route_requests_total{path="standard",reason="long"}' in text
    assert 'infersight_route_request_duration_seconds_count{path="fast"}' in text
    assert 'infersight_slo_attainment_ratio{path="fast",window="5m"}' in text
    assert 'infersight_route_breaker_state{path="standard"} 0.0' in text
    page = client.get("/api/v1/overview", headers=auth()).json()["routing"]
    assert [p["path"] for p in page["paths"]] == ["fast", "standard"]
    assert page["paths"][0]["version"] == INT8 and page["paths"][0]["requests"]["short"] >= 1
    assert service.parts.routing is not None

    def stored_paths() -> set[str | None]:
        with service.db.connect() as conn:
            return set(conn.execute(select(requests.c.path)).scalars())

    wait_for(lambda: {"fast", "standard"} <= stored_paths(), timeout=10.0)  # the requests table keeps it


def test_a_flood_of_long_prompts_sheds_long_ones_never_the_short_ones_and_the_breaker_closes(served) -> None:  # type: ignore[no-untyped-def]
    """Asserted by outcome, not speed (issue 22): the standard SLA (1 ms) is out of reach on
    any machine, so the standard breaker opens after a bounded number of long completions;
    whether the fast path meets its 100 ms on a loaded machine does not matter, since a
    request the fast path is configured for (32 + 8 tokens) is never shed."""
    app, client = served
    routing = app.state.service.parts.backend.runtime.routing  # type: ignore[attr-defined]
    stop = threading.Event()
    refused: list[dict[str, str]] = []

    def flood() -> None:
        while not stop.is_set():
            status, _, headers = _ask(client, LONG, 48)
            if status == 503:
                refused.append(headers)
                time.sleep(0.05)

    def state(path: str) -> object:
        return next(b for b in routing.statuses() if b.path == path)

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(6)]
    for t in threads:
        t.start()
    shorts: list[int] = []
    fast_thresholds: list[int] = []
    try:
        wait_for(lambda: state("standard").state == "open", timeout=120.0, interval=0.1)
        while len(shorts) < 20 or not refused:  # short requests while the breaker sheds the long ones
            assert len(shorts) < 400, "no long request was refused"
            shorts.append(_ask(client, SHORT, 4)[0])
            fast = state("fast")
            if fast.threshold_tokens is not None:
                fast_thresholds.append(fast.threshold_tokens)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert set(shorts) == {200}  # never shed: not 503 "requests over 12 tokens are refused"
    assert all(t >= 32 + 8 for t in fast_thresholds)  # the fast path's own requests are never its threshold's
    assert refused and all(int(h["retry-after"]) >= 1 for h in refused)
    assert (_metric(client, 'infersight_route_requests_total{path="standard",reason="shed"}') or 0) >= 1
    assert (_metric(client, 'infersight_route_requests_total{path="fast",reason="shed"}') or 0) == 0

    # shed requests are their own outcome: SLO misses, not server errors (no error-rate page)
    def shed_outcomes() -> float:  # a refusal's record is counted just after its answer is sent
        text = client.get("/metrics").text
        lines = [
            ln
            for ln in text.splitlines()
            if ln.startswith("infersight_client_outcomes_total{") and 'outcome="shed"' in ln
        ]
        return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0

    wait_for(lambda: shed_outcomes() >= len(refused), timeout=30.0)
    metrics = client.get("/metrics").text
    assert not [ln for ln in metrics.splitlines() if ln.startswith("gen_ai_server_request_errors_total{")]
    attainment = _metric(client, 'infersight_slo_attainment_ratio{path="standard",window="5m"}')
    assert attainment is not None and attainment < 1.0  # 0.0 too: every long one missed or shed
    # no long request after the flood: half-open after the cooldown, closed after another
    wait_for(lambda: state("standard").state == "closed", timeout=60.0, interval=0.2)
    assert _metric(client, 'infersight_route_breaker_state{path="standard"}') == 0.0
    assert _ask(client, LONG, 8)[0] == 200  # long ones are served again
    events = client.get("/api/v1/overview", headers=auth()).json()["routing"]["breaker_events"]
    assert [e["state"] for e in events if e["path"] == "standard"][:1] == ["open"]
    assert "closed" in [e["state"] for e in events if e["path"] == "standard"]


def test_one_metric_name_from_two_registries_keeps_the_series_of_both_once() -> None:
    from infersight.monitor.service.metrics import CombinedRegistry
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    by_slo, by_path = CollectorRegistry(), CollectorRegistry()
    Gauge("infersight_slo_attainment_ratio", "x", ["slo"], registry=by_slo).labels("fast-latency").set(0.99)
    both = Gauge("infersight_slo_attainment_ratio", "y", ["path", "window"], registry=by_path)
    both.labels("fast", "5m").set(0.5)
    out = CollectorRegistry()
    out.register(CombinedRegistry([by_slo, by_path, by_slo]))  # by_slo twice: its series once
    text = generate_latest(out).decode()
    assert text.count('infersight_slo_attainment_ratio{slo="fast-latency"} 0.99') == 1
    assert 'infersight_slo_attainment_ratio{path="fast",window="5m"} 0.5' in text
    assert text.count("# TYPE infersight_slo_attainment_ratio gauge") == 1
