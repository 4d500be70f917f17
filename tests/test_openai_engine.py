"""The OpenAI-compatible endpoints served by the embedded runtime with the demo model."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from _demo_registry import BAD, GOOD, private_copy, shared_demo_registry
from _service_support import auth, config, wait_for
from fastapi.testclient import TestClient
from infersight.monitor.service import EngineConfig, create_app
from infersight.monitor.store.tables import deploys, requests
from sqlalchemy import select


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, TestClient]]:
    demo_registry = shared_demo_registry(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("served")
    registry = private_copy(
        demo_registry, tmp / "registry"
    )  # deploys write their history beside the versions
    cfg = config(tmp, engine=EngineConfig(registry=registry, version=GOOD, max_batch_size=4, max_seq_len=512,
                                          max_prompt_tokens=256, max_tokens_limit=64))  # fmt: skip
    app = create_app(cfg)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield app, client


def _sse(lines: list[str]) -> list[object]:
    events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


def test_completion_answers_in_openai_shape_and_is_recorded(served) -> None:  # type: ignore[no-untyped-def]
    app, client = served
    r = client.post("/v1/completions", json={"model": GOOD, "prompt": "how do i top up my card", "max_tokens": 8,
                                             "temperature": 0})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "mixtral_banking"  # not the version
    choice = body["choices"][0]
    assert choice["finish_reason"] in ("stop", "length") and isinstance(choice["text"], str)
    assert body["usage"]["prompt_tokens"] == 7  # the WordPiece ids of the prompt
    assert 1 <= body["usage"]["completion_tokens"] <= 8
    service = app.state.service
    assert service.writer.flush()
    with service.db.connect() as conn:
        row = conn.execute(select(requests).where(requests.c.request_id == body["id"])).one()
    assert row.source == "engine" and row.model_version == GOOD
    assert row.prompt == "how do i top up my card" and row.response == choice["text"]
    assert row.output_tokens == body["usage"]["completion_tokens"] and row.ttft_s is not None
    metrics = client.get("/metrics").text
    assert (
        f'gen_ai_server_time_to_first_token_seconds_count{{model="mixtral_banking",model_version="{GOOD}"}}'
        in metrics
    )


def test_greedy_answers_are_deterministic_and_on_topic(served) -> None:  # type: ignore[no-untyped-def]
    _, client = served
    req = {"prompt": "my card payment was declined at the shop", "max_tokens": 12, "temperature": 0}
    a = client.post("/v1/completions", json=req).json()["choices"][0]["text"]
    b = client.post("/v1/completions", json=req).json()["choices"][0]["text"]
    assert a == b
    assert set(a.split()) & {"card", "payment", "declined", "shop", "my", "was", "at", "the"}


def test_streamed_chat_is_sse_ending_with_done_and_matches_the_whole_answer(served) -> None:  # type: ignore[no-untyped-def]
    _, client = served
    req = {"messages": [{"role": "system", "content": "you help bank customers"},
                        {"role": "user", "content": "why was my transfer declined"}],
           "max_tokens": 10, "temperature": 0}  # fmt: skip
    whole = client.post("/v1/chat/completions", json=req).json()
    assert whole["object"] == "chat.completion"
    with client.stream("POST", "/v1/chat/completions",
                       json={**req, "stream": True, "stream_options": {"include_usage": True}}) as r:  # fmt: skip
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = _sse(list(r.iter_lines()))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1
    assert chunks[-1]["usage"] == whole["usage"]


def test_streamed_completion_honours_a_stop_string(served) -> None:  # type: ignore[no-untyped-def]
    _, client = served
    req = {"prompt": "lost card lost card lost card", "max_tokens": 20, "temperature": 0}
    full = client.post("/v1/completions", json=req).json()["choices"][0]["text"]
    words = full.split()
    assert len(words) >= 3
    stop = words[2]
    with client.stream("POST", "/v1/completions", json={**req, "stream": True, "stop": [stop]}) as r:
        text = "".join(c["choices"][0]["text"] for c in _sse(list(r.iter_lines())))
    assert stop not in text and full.startswith(text)


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"prompt": "x", "max_tokens": 65}, 422, "body.max_tokens"),
        ({"prompt": "x", "n": 2}, 422, "body.n"),
        ({"prompt": "x", "temperature": 3}, 422, "body.temperature"),
        ({"prompt": "x", "model": "gpt-4"}, 404, "body.model"),
        ({"prompt": "word " * 300, "max_tokens": 4}, 400, "body.prompt"),
        ({"max_tokens": 4}, 422, "body.prompt"),
    ],
)
def test_bad_requests_get_a_4xx_naming_the_field(served, body, status, field) -> None:  # type: ignore[no-untyped-def]
    _, client = served
    r = client.post("/v1/completions", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["field"] == field


def test_deploy_and_rollback_through_the_api_are_recorded(served) -> None:  # type: ignore[no-untyped-def]
    app, client = served
    listed = client.get("/api/v1/models").json()
    assert listed["serving_version"] == GOOD and {v["name"] for v in listed["versions"]} >= {GOOD, BAD}
    assert client.post("/api/v1/models/deploy", json={"version": BAD}).status_code == 401
    r = client.post("/api/v1/models/deploy", json={"version": BAD}, headers=auth())
    assert r.status_code == 200 and r.json()["to_version"] == BAD
    served_by = client.post("/v1/completions", json={"prompt": "hi there", "max_tokens": 2}, headers=auth())
    assert served_by.headers["x-infersight-version"] == BAD
    r = client.post("/api/v1/models/rollback", headers=auth())
    assert r.status_code == 200 and r.json()["to_version"] == GOOD and r.json()["outcome"] == "rolled_back"
    assert client.post("/api/v1/models/deploy", json={"version": "mixtral_banking_fp32-v9.9"},
                       headers=auth()).status_code == 404  # fmt: skip
    assert (
        client.post("/api/v1/models/deploy", json={"version": "Not A Version"}, headers=auth()).status_code
        == 422
    )
    with app.state.service.db.connect() as conn:
        rows = conn.execute(select(deploys.c.to_version, deploys.c.reason).order_by(deploys.c.id)).all()
    assert [tuple(r) for r in rows][-3:] == [(GOOD, "start"), (BAD, "deploy"), (GOOD, "rollback")]
    overview = wait_for(lambda: (o := client.get("/api/v1/overview").json())["deploys"] and o)
    assert overview["serving_version"] == GOOD and overview["deploys"][0]["to_version"] == GOOD


@pytest.mark.parametrize(
    ("temperature", "top_p"), [(1e-300, 1.0), (5e-324, 0.5), (1.0, 1e-300), (2.0, 5e-324)]
)
def test_extreme_sampling_parameters_are_served_not_failed(served, temperature, top_p) -> None:  # type: ignore[no-untyped-def]
    _, client = served
    r = client.post(
        "/v1/completions",
        json={"prompt": "card", "max_tokens": 2, "temperature": temperature, "top_p": top_p},
    )
    assert r.status_code == 200, r.text


def test_v1_models_lists_the_stable_name_that_keeps_working_across_a_deploy(served) -> None:  # type: ignore[no-untyped-def]
    _, client = served
    listed = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert listed == ["mixtral_banking", GOOD]  # the stable name first, then the serving version
    stable = listed[0]
    req = {"model": stable, "prompt": "hi there", "max_tokens": 2}
    r = client.post("/v1/completions", json=req, headers=auth())
    assert r.json()["model"] == stable and r.headers["x-infersight-version"] == GOOD
    assert client.post("/api/v1/models/deploy", json={"version": BAD}, headers=auth()).status_code == 200
    try:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [stable, BAD]
        r = client.post("/v1/completions", json=req, headers=auth())  # a client configured before the deploy
        assert (
            r.status_code == 200 and r.json()["model"] == stable and r.headers["x-infersight-version"] == BAD
        )
        chat = {"model": stable, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
    finally:
        assert client.post("/api/v1/models/rollback", headers=auth()).status_code == 200
    assert client.post("/v1/completions", json=req, headers=auth()).headers["x-infersight-version"] == GOOD


def test_metrics_name_the_decode_path_the_serving_version_runs_on(served) -> None:  # type: ignore[no-untyped-def]
    app, client = served
    path = app.state.service.parts.backend.runtime.engine_paths()[GOOD]
    metrics = client.get("/metrics").text
    assert (
        f'infersight_engine_path_info{{activations="{path.activations}",cpu="{path.cpu}",'
        f'kernels="{path.kernels}",model="mixtral_banking",model_version="{GOOD}",'
        f'path="{path.name}",reason="{path.reason.split(":")[0]}"}} 1.0'
    ) in metrics
    assert path.kernels in ("none", "plain", "avx2", "avx512", "avx512-vnni", "avx512-bf16") and path.activations
    assert path.name in ("eager", "native") and path.reason in ("measured", "cached")


def test_each_call_records_its_max_tokens_stream_flag_and_finish_reason(served) -> None:  # type: ignore[no-untyped-def]
    app, client = served
    whole = client.post("/v1/completions", json={"prompt": "how do i top up my card", "max_tokens": 3,
                                                 "temperature": 0}).json()  # fmt: skip
    req = {"messages": [{"role": "user", "content": "why was my transfer declined"}], "max_tokens": 5,
           "temperature": 0, "stream": True}  # fmt: skip
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        chunks = _sse(list(r.iter_lines()))
    [streamed_finish] = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]]
    unbounded = client.post("/v1/completions", json={"prompt": "my card", "temperature": 0}).json()
    service = app.state.service
    assert service.writer.flush()
    with service.db.connect() as conn:
        rows = {
            r.request_id: r
            for r in conn.execute(
                select(requests).where(
                    requests.c.request_id.in_([whole["id"], chunks[0]["id"], unbounded["id"]])
                )
            )
        }
    a, b, c = rows[whole["id"]], rows[chunks[0]["id"]], rows[unbounded["id"]]
    assert (a.max_tokens, a.stream, a.finish_reason) == (3, False, whole["choices"][0]["finish_reason"])
    assert (b.max_tokens, b.stream, b.finish_reason) == (5, True, streamed_finish)
    # a completion that does not say max_tokens asks for OpenAI's default, 16
    assert (c.max_tokens, c.stream, c.finish_reason) == (16, False, unbounded["choices"][0]["finish_reason"])
