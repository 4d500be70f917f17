"""A real model: SmolLM2-135M-Instruct's GGUF (q4_1 weights, q8_0 embeddings), imported with
`infersight models import`, against transformers' own reading of the same file, then served
and asked through the official `openai` client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("transformers")

from _service_support import wait_for  # noqa: E402
from _smollm2 import FILE, FP32, smollm2_gguf, smollm2_registry  # noqa: E402
from conftest import free_port  # noqa: E402
from infersight.engine import load  # noqa: E402
from infersight.engine.registry import Registry  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "How do I reset my card PIN?",
    "Write one sentence about the sea.",
    "Why is the sky blue?",
]
STEPS = 32


def _chat(tokenizer, question: str) -> list[int]:  # type: ignore[no-untyped-def]
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a loaded 2-core machine; a quiet one takes a small part of this
def test_import_matches_transformers_reading_of_the_same_gguf(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = smollm2_gguf()
    model = load(Registry(smollm2_registry(tmp_path_factory)).get(FP32).path)
    reference = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=FILE, dtype=torch.float32
    ).eval()
    # equal lengths so the five prompts run as one batch: each keeps its last L tokens
    prompts = [_chat(model.tokenizer, q) for q in QUESTIONS]
    length = min(len(p) for p in prompts)
    ids = torch.tensor([p[-length:] for p in prompts])
    with torch.no_grad():
        want = reference(ids).logits
        got = model.logits(ids)
        assert float((got - want).abs().max() / (want.max() - want.min())) < 1e-4
        tokens, past, step = [], None, ids  # transformers' greedy decode, no early stop
        for _ in range(STEPS):
            out = reference(step, past_key_values=past, use_cache=True)
            past, step = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(step)
    assert model.generate(ids, STEPS).tolist() == torch.cat(tokens, dim=1).tolist()

    # the rebuilt tokenizer: transformers' ids wherever both follow llama.cpp (it does not split
    # digits one by one, as this vocabulary's own tokenizer and llama.cpp's `smollm` do)
    theirs = AutoTokenizer.from_pretrained(source.parent, gguf_file=FILE)
    for text in ["Hello world, it's me!", "  two spaces\n\nnewlines\ttabs", "<|im_start|>user\nhi<|im_end|>",
                 "émojis 😀 ünïcödé", "don't   stop"]:  # fmt: skip
        assert model.tokenizer.encode(text, add_special_tokens=False).ids == theirs.encode(
            text, add_special_tokens=False
        )
    digits = model.tokenizer.encode("in 2024", add_special_tokens=False).tokens
    assert digits[-4:] == ["2", "0", "2", "4"]


def _ready(url: str, process: subprocess.Popen[bytes], log: Path) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"infersight serve exited {process.returncode}:\n{log.read_text()[-3000:]}")
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_served_smollm2_answers_paris_through_the_openai_client(tmp_path_factory: pytest.TempPathFactory,
                                                              tmp_path: Path) -> None:  # fmt: skip
    openai = pytest.importorskip("openai")
    from infersight.monitor.store import sqlite_url
    from infersight.monitor.store.tables import requests
    from sqlalchemy import create_engine, select

    registry = smollm2_registry(tmp_path_factory)
    port, token, log = free_port(), "t0ken-for-the-test", tmp_path / "serve.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "INFERSIGHT_TOKEN": token}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "infersight.monitor.cli", "serve", "--registry", str(registry), "--version", FP32,
             "--port", str(port), "--data-dir", str(tmp_path / "var")],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url, process, log), timeout=240.0, interval=0.5)
        client = openai.OpenAI(base_url=url + "/v1", api_key=token, timeout=120.0)
        question = [{"role": "user", "content": "What is the capital of France?"}]
        whole = client.chat.completions.create(model=FP32, messages=question, temperature=0, max_tokens=24)
        answer = whole.choices[0].message.content or ""
        assert "Paris" in answer and whole.choices[0].finish_reason == "stop"  # <|im_end|> ended it
        assert "<|im_end|>" not in answer
        chunks = client.chat.completions.create(model=FP32, messages=question, temperature=0, max_tokens=24,
                                                stream=True)  # fmt: skip
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == answer
        db = create_engine(sqlite_url(tmp_path / "var"))

        def recorded() -> list[object]:
            with db.connect() as conn:
                return list(conn.execute(select(requests).where(requests.c.request_id == whole.id)).all())

        try:
            rows = wait_for(recorded, timeout=30.0, interval=0.25)
        finally:
            db.dispose()
        (row,) = rows
        assert row.source == "engine" and row.model_version == FP32 and row.response == answer
        assert row.ttft_s is not None and row.ttft_s > 0 and row.tpot_s is not None and row.tpot_s > 0
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
