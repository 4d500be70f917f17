"""The upstream proxy against a local fake OpenAI-compatible server.

The upstream (vLLM, TGI, llama.cpp's server) is an external boundary we do not run here,
so a small real HTTP server on loopback stands in for it: it checks what it receives as
those servers would (JSON body, model, Authorization) and answers in their wire format,
streaming one SSE chunk per token with a delay, so time to first token is measurable.
Asked for `SLOW_PROMPT`, it takes up to 30 s and notes when its client (the proxy) hangs up.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvicorn
from _service_support import config, wait_for
from conftest import free_port
from fastapi.testclient import TestClient
from infersight.monitor.service import UpstreamConfig, create_app
from infersight.monitor.service.config import LimitsConfig
from infersight.monitor.store.tables import requests
from sqlalchemy import select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WORDS = ["you", " can", " top", " up", " in", " the", " app"]
TOKEN_DELAY_S = 0.05
FIRST_TOKEN_DELAY_S = 0.2
SLOW_PROMPT = "a slow answer"
ABANDONED: list[str] = []  # the slow requests whose client hung up before their answer


def _fake_upstream() -> Starlette:
    seen: list[dict[str, Any]] = []

    async def completions(request: Request) -> Response:
        raw = await request.body()
        body = orjson.loads(raw)
        seen.append({"path": request.url.path, "body": body, "auth": request.headers.get("authorization"),
                     "raw": raw})  # fmt: skip
        if body.get("model") != MODEL:
            return JSONResponse({"object": "error", "message": f"The model `{body.get('model')}` does not exist.",
                                 "type": "NotFoundError", "code": 404}, status_code=404)  # fmt: skip
        chat = request.url.path.endswith("/chat/completions")
        valid = (
            isinstance(body.get("messages"), list) and all("role" in m for m in body["messages"])
            if chat
            else isinstance(body.get("prompt"), str | list)
        )
        if not valid:  # as vLLM answers a body it cannot read
            return JSONResponse({"object": "error", "message": "invalid request", "type": "BadRequestError",
                                 "code": 400}, status_code=400)  # fmt: skip
        if body.get("prompt") == SLOW_PROMPT:  # as vLLM aborts a request whose connection closed
            for _ in range(1500):
                if await request.is_disconnected():
                    ABANDONED.append(str(body.get("user")))
                    return Response(status_code=499)
                await asyncio.sleep(0.02)
        if not body.get("stream"):
            await asyncio.sleep(FIRST_TOKEN_DELAY_S)
            text = "".join(WORDS)
            choice = {"index": 0, "finish_reason": "stop",
                      **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}  # fmt: skip
            return JSONResponse({"id": "cmpl-1", "object": "chat.completion" if chat else "text_completion",
                                 "model": MODEL, "choices": [choice],
                                 "usage": {"prompt_tokens": 11, "completion_tokens": len(WORDS), "total_tokens": 18}})  # fmt: skip

        async def stream() -> AsyncIterator[bytes]:
            await asyncio.sleep(FIRST_TOKEN_DELAY_S)
            if chat:
                yield (
                    b'data: {"id":"c","object":"chat.completion.chunk","model":"%s","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
                    % MODEL.encode()
                )
            for w in WORDS:
                delta = {"content": w} if chat else None
                chunk = {"id": "c", "object": "chat.completion.chunk" if chat else "text_completion", "model": MODEL,
                         "choices": [{"index": 0, **({"delta": delta} if chat else {"text": w}), "finish_reason": None}]}  # fmt: skip
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
                await asyncio.sleep(TOKEN_DELAY_S)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield b"data: " + orjson.dumps({"id": "c", "model": MODEL, "choices": [], "usage": {
                    "prompt_tokens": 11, "completion_tokens": len(WORDS), "total_tokens": 18}}) + b"\n\n"  # fmt: skip
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/chat/completions", completions, methods=["POST"]),
                            Route("/v1/models", models)])  # fmt: skip
    app.state.seen = seen
    return app


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    app = _fake_upstream()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=10)
    yield f"http://127.0.0.1:{port}", app.state.seen
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def proxy(upstream, tmp_path: Path) -> Iterator[tuple[Any, TestClient]]:  # type: ignore[no-untyped-def]
    url, _ = upstream
    cfg = config(tmp_path, upstream=UpstreamConfig(url=url, model="llama-8b", timeout_s=10))
    app = create_app(cfg)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield app, client


def _rows(app: Any) -> list[Any]:
    service = app.state.service
    service.writer.flush()
    with service.db.connect() as conn:
        return list(conn.execute(select(requests).order_by(requests.c.id)).all())


def test_a_streamed_chat_passes_through_untouched_and_is_observed(proxy, upstream) -> None:  # type: ignore[no-untyped-def]
    app, client = proxy
    _, seen = upstream
    req = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "how do I top up?"}]}
    t0 = time.perf_counter()
    with client.stream(
        "POST", "/v1/chat/completions", json=req, headers={"Authorization": "Bearer sk-user"}
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    elapsed = time.perf_counter() - t0
    assert lines[-1] == "data: [DONE]"
    text = "".join(orjson.loads(x[6:])["choices"][0]["delta"].get("content", "") for x in lines[:-1])
    assert text == "".join(WORDS)
    assert seen[-1]["auth"] == "Bearer sk-user" and seen[-1]["body"] == req  # forwarded as sent
    (row,) = wait_for(lambda: _rows(app))
    assert row.source == "proxy" and row.model == "llama-8b" and row.model_version == MODEL
    assert row.prompt == "how do I top up?" and row.response == "".join(WORDS)
    assert row.output_tokens == len(WORDS)  # counted from the chunks: no usage in this stream
    assert FIRST_TOKEN_DELAY_S * 0.9 <= row.ttft_s < row.duration_s <= elapsed + 0.05
    assert row.duration_s >= FIRST_TOKEN_DELAY_S + (len(WORDS) - 1) * TOKEN_DELAY_S * 0.9
    assert row.tpot_s == pytest.approx((row.duration_s - row.ttft_s) / (len(WORDS) - 1), rel=0.3)
    metrics = client.get("/metrics").text
    assert (
        f'gen_ai_server_time_to_first_token_seconds_count{{model="llama-8b",model_version="{MODEL}"}} 1.0'
        in metrics
    )


def test_usage_from_the_upstream_gives_the_token_counts(proxy) -> None:  # type: ignore[no-untyped-def]
    app, client = proxy
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "card declined", "max_tokens": 32})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "".join(WORDS)
    req = {
        "model": MODEL,
        "prompt": "card declined",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/completions", json=req) as s:
        list(s.iter_lines())
    whole, streamed = wait_for(lambda: rows if len(rows := _rows(app)) == 2 else None)
    assert (whole.prompt_tokens, whole.output_tokens) == (11, len(WORDS))
    assert whole.ttft_s is None  # not observable in a non-streamed answer
    assert (streamed.prompt_tokens, streamed.output_tokens) == (11, len(WORDS))
    assert streamed.ttft_s is not None
    # the request's shape: from the body, and the finish reason from the upstream's answer
    assert (whole.max_tokens, whole.stream, whole.finish_reason) == (32, False, "stop")
    assert (streamed.max_tokens, streamed.stream, streamed.finish_reason) == (None, True, None)


def test_an_upstream_4xx_is_passed_through_and_counted_as_the_clients_error(proxy) -> None:  # type: ignore[no-untyped-def]
    app, client = proxy
    r = client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404 and "does not exist" in r.json()["message"]
    (row,) = wait_for(lambda: _rows(app))
    assert row.error_type == "client_error"  # the client asked for a model the upstream lacks
    metrics = client.get("/metrics").text
    assert 'infersight_upstream_errors_total{error_type="http_404"} 1.0' in metrics
    assert (
        # a name the upstream refused takes no label slot: recorded under the configured model
        'infersight_client_outcomes_total{model="llama-8b",model_version="llama-8b",outcome="client_error"} 1.0'
        in metrics
    )
    assert "gen_ai_server_request_errors_total{" not in metrics  # not a server error
    assert client.get("/v1/models").json()["data"][0]["id"] == MODEL


def test_an_unreachable_upstream_is_502_and_recorded(tmp_path: Path) -> None:
    cfg = config(tmp_path, upstream=UpstreamConfig(url=f"http://127.0.0.1:{free_port()}", timeout_s=2))
    with TestClient(create_app(cfg), raise_server_exceptions=False) as client:
        r = client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 502
        assert r.json()["error"]["type"] == "upstream_error"
        (row,) = wait_for(lambda: _rows(client.app))
        assert row.error_type == "UpstreamUnreachable"


TOOLS = [{"type": "function", "function": {"name": "get_balance", "description": "the account balance",
                                           "parameters": {"type": "object", "properties": {"account": {"type": "string"}}}}}]  # fmt: skip
# fmt: off
PASS_THROUGH = [
    pytest.param("/v1/completions", {"model": MODEL, "prompt": [101, 2129, 2079, 1045]}, None, id="token-ids"),
    pytest.param("/v1/completions", {"model": MODEL, "prompt": [[101, 2129], [101, 2079]]}, None,
                 id="batch-of-token-ids"),
    pytest.param("/v1/completions", {"model": MODEL, "prompt": "top up", "stop": ["a", "b", "c", "d", "e", "\n\n"]},
                 "top up", id="six-stop-strings"),
    pytest.param("/v1/chat/completions", {
        "model": MODEL, "tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": False,
        "messages": [
            {"role": "user", "content": "what is my balance?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_balance", "arguments": '{"account": "main"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"balance": 12.5}'},
        ]}, "what is my balance?", id="tools-and-tool-calls"),
    pytest.param("/v1/chat/completions", {
        "model": MODEL, "functions": [TOOLS[0]["function"]],
        "messages": [{"role": "user", "content": "balance?"},
                     {"role": "function", "name": "get_balance", "content": "12.5"}]},
        "balance?", id="function-role"),
    pytest.param("/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is on this card?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]},
        "what is on this card?", id="content-parts"),
    pytest.param("/v1/completions", {
        "model": MODEL, "prompt": "card declined", "top_k": 40, "repetition_penalty": 1.1, "min_p": 0.05,
        "logit_bias": {"50256": -100}, "guided_json": {"type": "object"}, "seed": -1, "user": "u" * 1000,
        "max_tokens": 5_000_000, "vendor_extension": {"nested": [1, 2, 3]}}, "card declined",
        id="unknown-and-vendor-fields"),
]
# fmt: on


@pytest.mark.parametrize(("path", "body", "observed_prompt"), PASS_THROUGH)
def test_every_request_the_upstream_accepts_passes_through_byte_for_byte(  # type: ignore[no-untyped-def]
    proxy, upstream, path: str, body: dict[str, Any], observed_prompt: str | None
) -> None:
    app, client = proxy
    _, seen = upstream
    raw = orjson.dumps(body)
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert seen[-1]["path"] == path and seen[-1]["raw"] == raw  # untouched
    (row,) = wait_for(lambda: _rows(app))
    assert row.error_type is None and row.model_version == MODEL and row.output_tokens == len(WORDS)
    assert row.prompt == observed_prompt  # text is observed where there is text; token ids are not text
    assert row.response == "".join(WORDS)


def test_the_proxy_refuses_only_a_body_it_cannot_observe(proxy, upstream) -> None:  # type: ignore[no-untyped-def]
    _app, client = proxy
    _, seen = upstream
    before = len(seen)
    for raw in (b"not json", b"[1, 2]"):
        r = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["error"]["field"] == "body"
    r = client.post("/v1/completions", json={"model": MODEL})  # no prompt: the upstream's call, and its 400
    assert r.status_code == 400 and r.json()["type"] == "BadRequestError"
    assert len(seen) == before + 1


def test_model_names_the_upstream_refused_take_no_label_slot(upstream, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _ = upstream
    cfg = config(tmp_path, upstream=UpstreamConfig(url=url, model="llama-8b", timeout_s=10),
                 limits=LimitsConfig(max_label_values=5))  # fmt: skip
    with TestClient(create_app(cfg), raise_server_exceptions=False) as client:
        for i in range(12):  # more junk names than label slots, each a 404 from the upstream
            r = client.post("/v1/completions", json={"model": f"junk-{i}", "prompt": "hi", "max_tokens": 2})
            assert r.status_code == 404
        assert (
            client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}).status_code
            == 200
        )
        metrics = client.get("/metrics").text
    assert f'model_version="{MODEL}"' in metrics
    assert "junk-" not in metrics and 'model_version="other"' not in metrics


def test_a_client_that_hangs_up_cancels_the_upstream_call_and_is_recorded_cancelled(  # type: ignore[no-untyped-def]
    upstream, tmp_path: Path
) -> None:
    """Through a real server: the hang-up (the connection closed) reaches the proxy only there."""
    url, seen = upstream
    port = free_port()
    app = create_app(
        config(tmp_path, port=port, upstream=UpstreamConfig(url=url, model="llama-8b", timeout_s=60))
    )
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=30)
        payload = orjson.dumps({"model": MODEL, "prompt": SLOW_PROMPT, "user": "leaves-early"})
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))  # fmt: skip
            wait_for(lambda: any(s["raw"] == payload for s in seen), timeout=30)  # the upstream has it
            time.sleep(0.05)
        # the socket is closed: the client hung up; the proxy closes its upstream call
        wait_for(lambda: "leaves-early" in ABANDONED, timeout=20)
        (row,) = wait_for(lambda: _rows(app), timeout=30)
        assert row.error_type == "cancelled" and row.prompt == SLOW_PROMPT and row.response is None
    finally:
        server.should_exit = True
        thread.join(30)
