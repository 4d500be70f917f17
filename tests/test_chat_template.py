"""/v1/chat/completions with a model's own chat template: rendered as transformers renders it,
sandboxed, a failure a 400 naming the messages; the end-of-turn token stops generation. With
two versions loaded, each answers (live or as a shadow) the chat in its own template."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gguf")
pytest.importorskip("jinja2")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _engine_serving_support import Recorder  # noqa: E402
from _gguf_writer import tiny_mixtral, write_gguf  # noqa: E402
from _service_support import auth, config  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from infersight.engine.events import PairCompleted  # noqa: E402
from infersight.engine.gguf import import_gguf  # noqa: E402
from infersight.engine.registry import Registry  # noqa: E402
from infersight.monitor.service import EngineConfig, create_app  # noqa: E402
from infersight.monitor.service.chat_template import ChatTemplateFailed, render_template  # noqa: E402

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
STRICT = (
    "{% if messages[0]['role'] != 'user' %}{{ raise_exception('the first message must come from the user') }}"
    "{% endif %}{% for m in messages %}\n  {{ m['role'] }}: {{ m['content'] | tojson }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "héllo"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "and then?"},
    ],
]


@pytest.mark.parametrize("template", [CHATML, STRICT])
def test_templates_render_as_transformers_apply_chat_template_renders_them(template: str) -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    tokens = {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}
    for messages in CONVERSATIONS[:1] if template is STRICT else CONVERSATIONS:
        (theirs,), _ = render_jinja_template(
            [messages], chat_template=template, add_generation_prompt=True, **tokens
        )
        assert render_template(template, messages, tokens) == theirs


def test_a_template_cannot_reach_python_internals() -> None:
    with pytest.raises(ChatTemplateFailed, match="sandbox"):
        render_template("{{ messages.__class__.__mro__[1].__subclasses__() }}", CONVERSATIONS[0], {})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, object]]:
    tmp = tmp_path_factory.mktemp("chat")
    path = write_gguf(tiny_mixtral(), tmp / "m.gguf", chat_template=STRICT)
    registry = Registry(tmp / "registry")
    info, _ = import_gguf(registry, "mixtral_tiny_fp32-v1.0", path)
    cfg = config(tmp, engine=EngineConfig(registry=registry.root, version=info.name, max_batch_size=2,
                                          max_seq_len=256, max_prompt_tokens=200, max_tokens_limit=16))  # fmt: skip
    with TestClient(create_app(cfg), raise_server_exceptions=False) as client:
        from infersight.engine import load

        yield client, load(info.path)


def test_chat_is_prompted_with_the_models_own_template(served) -> None:  # type: ignore[no-untyped-def]
    client, model = served
    messages = CONVERSATIONS[0]
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    rendered = render_template(STRICT, messages, {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"})
    assert "user: " in rendered and rendered.endswith("assistant:")
    assert r.json()["usage"]["prompt_tokens"] == len(
        model.tokenizer.encode(rendered, add_special_tokens=False).ids
    )


def test_a_template_that_fails_is_a_400_naming_the_messages(served) -> None:  # type: ignore[no-untyped-def]
    client, _ = served
    body = {
        "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}],
        "max_tokens": 4,
    }
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["field"] == "body.messages" and error["code"] == "invalid_messages"
    assert "the first message must come from the user" in error["message"]


def test_the_end_of_turn_token_stops_generation_as_eos_does(tmp_path: Path) -> None:
    from infersight.engine import load

    registry = Registry(tmp_path / "registry")
    info, _ = import_gguf(registry, "mixtral_tiny_fp32-v1.0", write_gguf(tiny_mixtral(), tmp_path / "m.gguf"))
    eos = load(info.path).config.eos_token_ids
    (info.path / "generation_config.json").write_text('{"eos_token_id": [7, 299]}')
    assert load(info.path).config.eos_token_ids == tuple(dict.fromkeys((*eos, 7, 299)))


# A release whose only change is its template: its default system message asks for terse answers.
TERSE = CHATML.replace("You are a helpful AI assistant", "Answer in one word, no more.")
STABLE, CANARY = "mixtral_tiny_fp32-v1.0", "mixtral_tiny_fp32-v1.1"
SAME, FAILING = "mixtral_tiny_fp32-v1.2", "mixtral_tiny_fp32-v1.3"  # CHATML again; STRICT


@dataclass
class Releases:
    client: TestClient
    pairs: Recorder  # the runtime's events
    tokenizer: Any  # the versions' one tokenizer


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Releases]:
    """A service on STABLE (CHATML) pairing every request; its registry holds the template-only releases."""
    tmp = tmp_path_factory.mktemp("chat-releases")
    registry = Registry(tmp / "registry")
    for name, template in ((STABLE, CHATML), (CANARY, TERSE), (SAME, CHATML), (FAILING, STRICT)):
        import_gguf(registry, name, write_gguf(tiny_mixtral(), tmp / f"{name}.gguf", chat_template=template))
    cfg = config(tmp, engine=EngineConfig(registry=registry.root, version=STABLE, max_batch_size=2,
                                          max_seq_len=256, max_prompt_tokens=200, max_tokens_limit=16,
                                          pair_share=1.0))  # fmt: skip
    app = create_app(cfg)
    with TestClient(app, raise_server_exceptions=False) as client:
        runtime = app.state.service.parts.backend.runtime
        recorder = Recorder()
        runtime.subscribe(recorder)
        yield Releases(client, recorder, runtime.tokenizer)


def _canary(client: TestClient, version: str) -> None:
    r = client.post("/api/v1/models/canary", json={"version": version, "weight": 0.5}, headers=auth())
    assert r.status_code == 200, r.text


def _abort(client: TestClient) -> None:
    assert client.post("/api/v1/models/canary/abort", headers=auth()).status_code == 200


def _ids(tokenizer: Any, template: str, messages: list[dict[str, str]]) -> tuple[int, ...]:
    rendered = render_template(
        template, messages, {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}
    )
    return tuple(tokenizer.encode(rendered, add_special_tokens=False).ids)


def _pair(releases: Releases, request_id: str) -> PairCompleted:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = releases.pairs.of(PairCompleted, request_id)
        if found:
            return found[0]  # type: ignore[no-any-return]
        time.sleep(0.02)
    raise AssertionError(f"no pair for {request_id}")


def test_each_version_answers_a_chat_in_its_own_template_live_and_as_shadow(releases: Releases) -> None:
    client = releases.client
    messages = CONVERSATIONS[0]
    own = {
        STABLE: _ids(releases.tokenizer, CHATML, messages),
        CANARY: _ids(releases.tokenizer, TERSE, messages),
    }
    assert own[STABLE] != own[CANARY]
    _canary(client, CANARY)
    try:
        served = {}
        for user in (f"user-{i}" for i in range(40)):
            body = {"messages": messages, "max_tokens": 3, "temperature": 0, "user": user}
            r = client.post("/v1/chat/completions", json=body, headers=auth())
            assert r.status_code == 200, r.text
            served.setdefault(r.headers["x-infersight-version"], r.json())
            if len(served) == 2:
                break
    finally:
        _abort(client)
    assert set(served) == {STABLE, CANARY}
    for live, answer in served.items():
        other = CANARY if live == STABLE else STABLE
        assert answer["usage"]["prompt_tokens"] == len(own[live])  # the live prompt, rendered its way
        pair = _pair(releases, answer["id"])
        assert (pair.live_version, pair.other_version) == (live, other)
        assert pair.prompt_ids == own[live] and pair.other_prompt_ids == own[other]


def test_versions_with_one_template_are_prompted_as_before(releases: Releases) -> None:
    client = releases.client
    messages = CONVERSATIONS[1]
    _canary(client, SAME)
    try:
        body = {"messages": messages, "max_tokens": 3, "temperature": 0, "user": "someone"}
        r = client.post("/v1/chat/completions", json=body, headers=auth())
    finally:
        _abort(client)
    assert r.status_code == 200, r.text
    ids = _ids(releases.tokenizer, CHATML, messages)
    pair = _pair(releases, r.json()["id"])
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    assert pair.prompt_ids == pair.other_prompt_ids == ids


def test_a_template_that_fails_for_any_loaded_version_is_a_400(releases: Releases) -> None:
    client = releases.client
    body = {"messages": CONVERSATIONS[1], "max_tokens": 3, "user": "someone"}  # a system message first
    assert client.post("/v1/chat/completions", json=body).status_code == 200  # CHATML renders it
    _canary(client, FAILING)
    try:
        users = [f"user-{i}" for i in range(8)]  # on either arm: STRICT refuses it for both
        answers = [client.post("/v1/chat/completions", json=body | {"user": u}) for u in users]
    finally:
        _abort(client)
    for r in answers:
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["field"] == "body.messages" and error["code"] == "invalid_messages"
        assert "the first message must come from the user" in error["message"]
