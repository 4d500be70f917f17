"""/v1/chat/completions with a model's own chat template: rendered as transformers renders it,
sandboxed, a failure a 400 naming the messages; the end-of-turn token stops generation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("jinja2")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _gguf_writer import tiny_mixtral, write_gguf  # noqa: E402
from _service_support import config  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
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
