"""Proxy mode's paired checks: a shadow upstream answers a share of live requests again.

Both upstreams (vLLM, TGI, llama.cpp's server in production) are external boundaries we do
not run here, so two small real HTTP servers on loopback stand in for them, answering in the
OpenAI wire format: the live one as the new release, the shadow one as the previous release
(another text, another model name). The shadow server can be held (a gate the test opens) to
play a slow shadow upstream without any wall-clock assumption.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvicorn
from _service_support import TOKEN, config, wait_for
from conftest import free_port
from fastapi.testclient import TestClient
from infersight.monitor.service import UpstreamConfig, create_app
from infersight.monitor.service.config import (
    AlertingConfig,
    ConfigInvalid,
    ShadowUpstreamConfig,
    config_from_mapping,
)
from infersight.monitor.service.pair_feed import PROXY_PAIRS_OFF
from infersight.monitor.store.tables import deploy_analyses, requests
from sqlalchemy import select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

LIVE_MODEL = "llama-v2"
SHADOW_MODEL = "llama-v1"
LIVE_WORDS = ["you", " can", " top", " up", " in", " the", " app"]
SHADOW_WORDS = ["top", " up", " in", " the", " app"]
CLIENT_AUTH = {"Authorization": "Bearer sk-client"}


class FakeUpstream:
    """An OpenAI-compatible server on loopback: records every body, answers `words` as `model`."""

    def __init__(self, model: str, words: list[str]) -> None:
        self.model, self.words = model, words
        self.seen: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.gate = threading.Event()  # cleared: answers wait (a slow upstream)
        self.gate.set()
        self.answered = 0
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        app = Starlette(routes=[Route("/v1/completions", self._answer, methods=["POST"]),
                                Route("/v1/chat/completions", self._answer, methods=["POST"])])  # fmt: skip
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                    lifespan="off"))  # fmt: skip
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def _answer(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.seen.append(body)
        self.auth.append(request.headers.get("authorization"))
        while not self.gate.is_set():
            await asyncio.sleep(0.01)
        chat = request.url.path.endswith("/chat/completions")
        self.answered += 1
        if not body.get("stream"):
            text = "".join(self.words)
            choice = {"index": 0, "finish_reason": "stop",
                      **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}  # fmt: skip
            return JSONResponse({"id": "c", "model": self.model, "choices": [choice],
                                 "usage": {"prompt_tokens": 4, "completion_tokens": len(self.words)}})  # fmt: skip

        async def stream() -> AsyncIterator[bytes]:
            for i, w in enumerate(self.words):
                part = {"delta": {"content": w}} if chat else {"text": w}
                last = i == len(self.words) - 1
                chunk = {"id": "c", "model": self.model,
                         "choices": [{"index": 0, **part, "finish_reason": "stop" if last else None}]}  # fmt: skip
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    def __enter__(self) -> FakeUpstream:
        self.thread.start()
        wait_for(lambda: self.server.started, timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.set()
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def live() -> Iterator[FakeUpstream]:
    with FakeUpstream(LIVE_MODEL, LIVE_WORDS) as up:
        yield up


@pytest.fixture
def shadow() -> Iterator[FakeUpstream]:
    with FakeUpstream(SHADOW_MODEL, SHADOW_WORDS) as up:
        yield up


def _proxy(tmp_path: Path, live: FakeUpstream, shadow_url: str | None, **shadow_cfg: Any) -> TestClient:
    cfg = config(
        tmp_path,
        upstream=UpstreamConfig(url=live.url, model="llama", timeout_s=30),
        shadow_upstream=ShadowUpstreamConfig(url=shadow_url, timeout_s=30, **shadow_cfg)
        if shadow_url
        else None,
        alerting=AlertingConfig(analysis_interval_s=0.5),
    )
    return TestClient(create_app(cfg), raise_server_exceptions=False)


def _metric(client: TestClient, outcome: str) -> float:
    prefix = f'infersight_shadow_requests_total{{model="llama",outcome="{outcome}"}} '
    (line,) = [x for x in client.get("/metrics").text.splitlines() if x.startswith(prefix)]
    return float(line.split()[-1])


def _ask(client: TestClient, i: int, *, stream: bool) -> tuple[dict[str, Any], str]:
    body: dict[str, Any] = {"model": "llama", "messages": [{"role": "user", "content": f"how do I top up? {i}"}],
                            "max_tokens": 16, "temperature": 0.7, "seed": 100 + i}  # fmt: skip
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        with client.stream("POST", "/v1/chat/completions", json=body, headers=CLIENT_AUTH) as r:
            assert r.status_code == 200
            lines = [x for x in r.iter_lines() if x and x != "data: [DONE]"]
        return body, "".join(orjson.loads(x[6:])["choices"][0]["delta"]["content"] for x in lines)
    r = client.post("/v1/chat/completions", json=body, headers=CLIENT_AUTH)
    assert r.status_code == 200
    return body, r.json()["choices"][0]["message"]["content"]


def _analysis_entries(client: TestClient, analysis_id: int) -> list[dict[str, Any]]:
    service: Any = client.app.state.service  # type: ignore[attr-defined]
    service.parts.alerts.analyzer.tick()  # the scheduler's job may have run it: either way it is stored
    with service.db.connect() as conn:
        row = conn.execute(select(deploy_analyses).where(deploy_analyses.c.id == analysis_id)).one()
    return list(json.loads(row.evidence))


def test_a_share_of_live_requests_is_shadowed_with_the_same_body_and_paired(  # type: ignore[no-untyped-def]
    live, shadow, tmp_path: Path
) -> None:
    shadow_cfg = {"share": 0.5, "max_in_flight": 8, "served_model": "llama-old", "api_key": "sk-shadow"}
    with _proxy(tmp_path, live, shadow.url, **shadow_cfg) as client:
        service: Any = client.app.state.service  # type: ignore[attr-defined]
        analysis_id = service.parts.alerts.analyzer.on_deploy(
            LIVE_MODEL, SHADOW_MODEL, dt.datetime.now(dt.UTC)
        )
        sent = [_ask(client, i, stream=i % 2 == 1) for i in range(8)]
        assert [text for _, text in sent] == ["".join(LIVE_WORDS)] * 8  # only the live upstream's answer
        assert [b for b in live.seen] == [b for b, _ in sent]
        wait_for(lambda: len(shadow.seen) == 4)  # floor(8 * 0.5): every second request
        expected = []
        for body, _ in sent[1::2]:
            body = dict(body, stream=False) if body.get("stream") else body
            expected.append({k: v for k, v in body.items() if k != "stream_options"} | {"model": "llama-old"})
        key = lambda b: orjson.dumps(b, option=orjson.OPT_SORT_KEYS)  # noqa: E731
        assert sorted(shadow.seen, key=key) == sorted(expected, key=key)  # same messages, params, seed
        assert shadow.auth == ["Bearer sk-shadow"] * 4 and live.auth == ["Bearer sk-client"] * 8
        feed = service.parts.backend.pair_feed
        wait_for(lambda: feed.score() >= 0 and feed.evidence.checks(LIVE_MODEL, SHADOW_MODEL)[0] == 4)
        _, checks = feed.evidence.checks(LIVE_MODEL, SHADOW_MODEL)
        by_name = {c.name: c for c in checks}
        assert by_name["finish_agreement"].pairs == 4 and by_name["finish_agreement"].above == 0
        assert by_name["output_length"].pairs == 4 and by_name["output_length"].below == 0  # live is longer
        assert by_name["output_length"].above == 4
        assert _metric(client, "paired") == 4 and _metric(client, "completed") == 4
        assert _metric(client, "dropped") == 0 and _metric(client, "failed") == 0
        overview = client.get("/api/v1/overview").json()["pairs"]
        assert overview["enabled"] and overview["scored"] == 4
        (comparison,) = overview["comparisons"]
        assert (comparison["candidate"], comparison["baseline"], comparison["pairs"]) == (
            LIVE_MODEL,
            SHADOW_MODEL,
            4,
        )
        assert any(
            c.startswith("output shorter in 0 and longer in 4 of 4 pairs") for c in comparison["checks"]
        )
        entries = wait_for(lambda: [e for e in _analysis_entries(client, analysis_id) if e["pairs"] == 4])
        assert (
            entries[-1]["paired"].startswith("4 pairs: ") and "output shorter in 0" in entries[-1]["paired"]
        )
        service.writer.flush()
        with service.db.connect() as conn:
            versions = [r.model_version for r in conn.execute(select(requests)).all()]
        assert versions == [LIVE_MODEL] * 8  # shadows are not traffic


def test_a_slow_shadow_upstream_never_holds_a_live_answer_and_extra_shadows_are_dropped(  # type: ignore[no-untyped-def]
    live, shadow, tmp_path: Path
) -> None:
    shadow.gate.clear()  # the shadow upstream answers nothing until the test lets it
    with _proxy(tmp_path, live, shadow.url, share=1.0, max_in_flight=2) as client:
        texts = [_ask(client, i, stream=i % 2 == 0)[1] for i in range(6)]
        assert texts == ["".join(LIVE_WORDS)] * 6  # all answered while no shadow has been
        wait_for(lambda: len(shadow.seen) == 2)
        assert shadow.answered == 0
        assert _metric(client, "paired") == 2 and _metric(client, "dropped") == 4
        assert 'infersight_shadow_waiting{model="llama"} 2.0' in client.get("/metrics").text
        shadow.gate.set()
        wait_for(lambda: _metric(client, "completed") == 2)
        assert 'infersight_shadow_waiting{model="llama"} 0.0' in client.get("/metrics").text


def test_an_unreachable_shadow_upstream_is_counted_and_the_live_answers_are_untouched(  # type: ignore[no-untyped-def]
    live, tmp_path: Path
) -> None:
    with _proxy(tmp_path, live, f"http://127.0.0.1:{free_port()}", share=1.0) as client:
        texts = [_ask(client, i, stream=i == 1)[1] for i in range(3)]
        assert texts == ["".join(LIVE_WORDS)] * 3
        wait_for(lambda: _metric(client, "failed") == 3)
        backend: Any = client.app.state.service.parts.backend  # type: ignore[attr-defined]
        assert _metric(client, "completed") == 0 and backend.pair_feed.scored == 0


def test_without_a_shadow_upstream_the_verdict_says_the_paired_checks_are_off(  # type: ignore[no-untyped-def]
    live, tmp_path: Path
) -> None:
    with _proxy(tmp_path, live, None) as client:
        service: Any = client.app.state.service  # type: ignore[attr-defined]
        assert service.parts.backend.pair_feed is None
        analysis_id = service.parts.alerts.analyzer.on_deploy(
            LIVE_MODEL, SHADOW_MODEL, dt.datetime.now(dt.UTC)
        )
        _ask(client, 0, stream=False)
        entries = wait_for(lambda: _analysis_entries(client, analysis_id))
        assert entries[-1]["paired"] == PROXY_PAIRS_OFF and entries[-1]["pairs"] == 0
        assert "infersight_shadow_requests_total" not in client.get("/metrics").text
        overview = client.get("/api/v1/overview").json()["pairs"]
        assert overview == {"enabled": False, "off_reason": PROXY_PAIRS_OFF, "scored": 0, "comparisons": []}


@pytest.mark.parametrize(
    ("shadow_cfg", "field"),
    [
        ({"url": "ftp://x"}, "shadow_upstream.url"),
        ({"url": "http://x", "share": 1.5}, "shadow_upstream.share"),
        ({"url": "http://x", "max_in_flight": 0}, "shadow_upstream.max_in_flight"),
        ({"url": "http://x", "colour": "red"}, "shadow_upstream.colour"),
    ],
)
def test_a_bad_shadow_upstream_is_refused_naming_its_field(shadow_cfg: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigInvalid) as err:
        config_from_mapping({"upstream": {"url": "http://127.0.0.1:9"}, "shadow_upstream": shadow_cfg})
    assert field in str(err.value)


def test_a_shadow_upstream_needs_proxy_mode() -> None:
    with pytest.raises(ConfigInvalid) as err:
        config_from_mapping({"shadow_upstream": {"url": "http://127.0.0.1:9"}})
    assert "shadow_upstream" in str(err.value) and "proxy mode" in str(err.value)
    parsed = config_from_mapping({"upstream": {"url": "http://127.0.0.1:9"},
                                  "shadow_upstream": {"url": "http://127.0.0.1:8", "model": "v1"}},
                                 env={"INFERSIGHT_SHADOW_UPSTREAM_API_KEY": "sk-shadow"})  # fmt: skip
    assert parsed.shadow_upstream == dataclasses.replace(
        ShadowUpstreamConfig(url="http://127.0.0.1:8"), model="v1", api_key="sk-shadow"
    )


# ---- a release of the upstream, marked by the pipeline that made it ---------------------------------


def _mark(client: TestClient, body: dict[str, Any], token: bool = True) -> Any:
    headers = {"Authorization": f"Bearer {TOKEN}"} if token else {}
    return client.post("/api/v1/deploys", json=body, headers=headers)


def test_a_release_marked_over_http_starts_a_paired_analysis_and_lists_its_verdict(  # type: ignore[no-untyped-def]
    live, shadow, tmp_path: Path
) -> None:
    with _proxy(tmp_path, live, shadow.url, share=1.0, max_in_flight=8, model=SHADOW_MODEL) as client:
        assert _mark(client, {"version": LIVE_MODEL}, token=False).status_code == 401
        r = _mark(client, {"version": LIVE_MODEL})
        assert r.status_code == 201, r.text
        marked = r.json()
        assert (marked["version"], marked["previous_version"]) == (LIVE_MODEL, SHADOW_MODEL)  # shadow's model
        assert marked["paired"].startswith("paired: shadow_upstream")
        history = client.get("/api/v1/models").json()["deploys"]
        assert [(d["from_version"], d["to_version"], d["reason"]) for d in history] == [
            (SHADOW_MODEL, LIVE_MODEL, "deploy")
        ]
        for i in range(6):
            _ask(client, i, stream=False)
        feed: Any = client.app.state.service.parts.backend.pair_feed  # type: ignore[attr-defined]
        wait_for(lambda: feed.score() >= 0 and feed.evidence.checks(LIVE_MODEL, SHADOW_MODEL)[0] == 6)
        wait_for(lambda: [e for e in _analysis_entries(client, marked["analysis_id"]) if e["pairs"] == 6])
        (analysis,) = client.get("/api/v1/analyses").json()["analyses"]
        assert (analysis["id"], analysis["version"], analysis["previous_version"]) == (
            marked["analysis_id"],
            LIVE_MODEL,
            SHADOW_MODEL,
        )
        assert analysis["state"] == "running" and analysis["checks"] >= 1
        assert analysis["last_check"]["pairs"] == 6 and analysis["last_check"]["paired"].startswith(
            "6 pairs: "
        )


def test_a_marked_release_that_regresses_on_pairs_is_paged_saying_to_roll_back_the_upstream(  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    # the new release answers one word where the previous one answered a sentence, and stops on its budget
    with (
        FakeUpstream(LIVE_MODEL, ["ok"]) as new,
        FakeUpstream(SHADOW_MODEL, LIVE_WORDS * 2) as old,
        _proxy(tmp_path, new, old.url, share=1.0, max_in_flight=8, model=SHADOW_MODEL) as client,
    ):
        marked = _mark(client, {"version": LIVE_MODEL, "previous_version": SHADOW_MODEL}).json()
        for i in range(12):
            _ask(client, i, stream=i % 3 == 0)
        feed: Any = client.app.state.service.parts.backend.pair_feed  # type: ignore[attr-defined]
        wait_for(lambda: feed.score() >= 0 and feed.evidence.checks(LIVE_MODEL, SHADOW_MODEL)[0] == 12)

        def paged() -> Any:
            _analysis_entries(client, marked["analysis_id"])  # a check now (the scheduler's may also run)
            alerts = client.get("/api/v1/alerts").json()["alerts"]
            return [a for a in alerts if a["alertname"] == "PostDeployRegression"]

        (alert,) = wait_for(paged, what="the PostDeployRegression page")
        summary = alert["annotations"]["summary"]
        assert "output shorter in 12 and longer in 0 of 12 pairs" in summary, summary
        assert "(12 pairs)" in summary and "roll back the upstream" in summary, summary
        assert alert["labels"]["model_version"] == LIVE_MODEL
        (analysis,) = client.get("/api/v1/analyses").json()["analyses"]
        assert analysis["state"] == "rollback_refused"
        assert any("output shorter in 12" in f for f in analysis["last_check"]["failures"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"version": "llama-v2\n"}, "version"),
        ({"version": "llama v2"}, "version"),
        ({"version": LIVE_MODEL, "previous_version": "x" * 300}, "previous_version"),
        ({"version": LIVE_MODEL, "at": "2999-01-01T00:00:00Z"}, "body.at"),
        ({"version": LIVE_MODEL, "at": "2020-01-01T00:00:00Z"}, "body.at"),
        ({"version": LIVE_MODEL, "at": "2026-01-01T00:00:00"}, "body.at"),
        ({"version": LIVE_MODEL, "at": "yesterday"}, "at"),
    ],
)
def test_a_bad_release_mark_is_a_4xx_naming_its_field_and_stores_nothing(  # type: ignore[no-untyped-def]
    live, tmp_path: Path, body: dict[str, Any], field: str
) -> None:
    with _proxy(tmp_path, live, None) as client:
        r = _mark(client, body)
        assert r.status_code == 422 and field in r.text, r.text
        assert client.get("/api/v1/analyses").json() == {"analyses": []}
        assert client.get("/api/v1/models").json()["deploys"] == []
