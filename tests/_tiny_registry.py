"""A model registry of tiny random Mixtral checkpoints written by transformers'
`save_pretrained` (no tokenizer): enough for the real runtime to deploy, fail over and
roll back in a fraction of a second."""

from __future__ import annotations

from pathlib import Path

import pytest


def tiny_registry(root: Path, names: tuple[str, ...]) -> Path:
    """`root/registry` with one checkpoint per name (seeded by position)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from infersight.engine.registry import Registry

    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
    )  # fmt: skip
    registry = Registry(root / "registry")
    for i, name in enumerate(names):
        torch.manual_seed(i)
        transformers.MixtralForCausalLM(config).save_pretrained(root / name)
        registry.register(name, root / name)
    return root / "registry"
