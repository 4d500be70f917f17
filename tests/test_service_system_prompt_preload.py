"""Chat system prompts in the records and in the prefix cache's preload: a system prompt shared
by many recorded chats is prefilled after a restart and at a deploy (real service, demo model,
SQLite store), and a store without those chats preloads nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _demo_registry import BAD, GOOD, private_copy, shared_demo_registry
from _service_support import auth, config, running
from infersight.monitor.records import InferenceRecord, InvalidRecord
from infersight.monitor.service import EngineConfig, ServiceConfig
from infersight.monitor.service.openai_api import MAX_SYSTEM_CHARS, ChatMessage, ChatRequest, render_chat
from infersight.monitor.store.tables import requests
from sqlalchemy import select

SYSTEM = (
    "you are the assistant of a retail bank. answer in two short sentences. never ask for a pin. "
    "if the customer is upset, apologise once and point them to the branch finder."
)
NEW = "is there a fee for this"  # the first question after the restart
NEW_AT_DEPLOY = "how long does a transfer take"  # the first question after the deploy
QUESTIONS = ["how do i top up my card", "what is the exchange rate today", "my card was declined",
             "where is my transfer", "can i change my pin"]  # fmt: skip
BLOCK = 8


def _config(tmp: Path, registry: Path) -> ServiceConfig:
    return config(tmp, engine=EngineConfig(registry=registry, version=GOOD, max_batch_size=2, max_seq_len=256,
                                           max_prompt_tokens=128, max_tokens_limit=16, prefix_cache_mb=64,
                                           prefix_block_tokens=BLOCK, preload_prompts=2))  # fmt: skip


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _shared_blocks(tokenizer: Any, new_question: str, recorded: list[str]) -> int:
    """Full blocks a new chat shares with every recorded one (as the served template renders them)."""

    def ids(question: str) -> list[int]:
        text = render_chat([ChatMessage.model_validate(m) for m in _messages(question)])
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    new = ids(new_question)
    common = min(next((i for i, (a, b) in enumerate(zip(new, ids(q), strict=False)) if a != b), len(new))
                 for q in recorded)  # fmt: skip
    return common // BLOCK


def _chat(client: Any, question: str, *, stream: bool = False) -> None:
    body = {"messages": _messages(question),
            "max_tokens": 2, "temperature": 0, "stream": stream}  # fmt: skip
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


def _first_chat_stats(client: Any, runtime: Any, version: str, question: str) -> Any:
    """The version's counters after its first request: a chat with the shared system prompt."""
    before = runtime.prefix_cache_stats().get(version)
    assert before is None or before.hits + before.misses == 0  # nothing served by it yet
    _chat(client, question)
    return runtime.prefix_cache_stats()[version]


def test_a_recorded_chat_system_prompt_is_preloaded_after_a_restart_and_at_a_deploy(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tmp = tmp_path_factory.mktemp("sysprompt")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    cfg = _config(tmp / "svc", registry)
    with running(cfg) as (app, client):
        for i, question in enumerate(QUESTIONS):  # no whole chat repeats; the system prompt does
            _chat(client, question, stream=i % 2 == 1)
        assert app.state.service.writer.flush()
        with app.state.service.db.connect() as conn:
            rows = conn.execute(select(requests.c.prompt, requests.c.system_prompt)).all()
        assert sorted(rows) == sorted((q, SYSTEM) for q in QUESTIONS)  # the question stays the prompt

    with running(cfg) as (app, client):  # a restart: a new runtime reading the same store
        runtime = app.state.service.parts.backend.runtime
        shared = _shared_blocks(runtime.tokenizer, NEW, QUESTIONS)
        assert shared >= 4
        warm = _first_chat_stats(client, runtime, GOOD, NEW)  # every shared block was prefilled at start
        assert warm.hits == shared and warm.tokens_saved == shared * BLOCK
        assert app.state.service.writer.flush()
        r = client.post("/api/v1/models/deploy", json={"version": BAD}, headers=auth())
        assert r.status_code == 200, r.text
        deployed = _first_chat_stats(client, runtime, BAD, NEW_AT_DEPLOY)  # before BAD served anything
        shared = _shared_blocks(runtime.tokenizer, NEW_AT_DEPLOY, [*QUESTIONS, NEW])
        assert deployed.hits == shared and deployed.tokens_saved == shared * BLOCK
        metrics = client.get("/metrics").text
        line = f'infersight_prefix_cache_tokens_saved_total{{model="mixtral_banking",model_version="{BAD}"}}'
        assert f"{line} {float(deployed.tokens_saved)}" in metrics

    with running(_config(tmp / "control", registry)) as (app, client):  # the control: no stored chats
        runtime = app.state.service.parts.backend.runtime
        cold = _first_chat_stats(client, runtime, GOOD, NEW)
        assert cold.hits == 0 and cold.tokens_saved == 0 and cold.misses >= shared


def test_a_chat_keeps_its_system_messages_before_the_question_joined_and_capped() -> None:
    chat = ChatRequest.model_validate({"messages": [
        {"role": "system", "content": "rule one"},
        {"role": "developer", "content": [{"type": "text", "text": "rule two"}]},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second question"},
        {"role": "system", "content": "after the question: not a prefix"},
    ]})  # fmt: skip
    assert chat.system_text() == "rule one\nrule two"
    assert chat.last_user_text() == "second question"
    assert ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]}).system_text() is None
    long = ChatRequest.model_validate(
        {
            "messages": [
                {"role": "system", "content": "x" * (MAX_SYSTEM_CHARS + 5)},
                {"role": "user", "content": "q"},
            ]
        }
    )
    assert long.system_text() == "x" * MAX_SYSTEM_CHARS


def test_a_record_carries_an_optional_system_prompt_and_a_bad_one_names_the_field() -> None:
    base = {"request_id": "r1", "model": "m", "model_version": "v1", "started_at": 1.0, "duration_s": 0.5}
    assert InferenceRecord.from_json(base).system_prompt is None  # the SDK need not send it
    record = InferenceRecord.from_json({**base, "system_prompt": "be brief"})
    assert record.system_prompt == "be brief" and InferenceRecord.from_json(record.to_json()) == record
    with pytest.raises(InvalidRecord) as info:
        InferenceRecord.from_json({**base, "system_prompt": 3})
    assert info.value.field == "system_prompt"
