"""Random tiny Mixtral checkpoints written by transformers' own `save_pretrained`.

Shared by the engine's tests: the reference model is `transformers.MixtralForCausalLM` on the
very weights the engine loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TINY: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 128,
    # larger than transformers' 0.02 so logits are O(1) and routing margins are real
    "initializer_range": 0.15,
}


def make_reference(seed: int = 0, **overrides: Any) -> Any:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    config = MixtralConfig(**(TINY | overrides))
    model = MixtralForCausalLM(config).eval()
    # transformers' plain per-expert loop: an independent reference (its default, grouped_mm,
    # is the very kernel the engine uses, and refuses sizes the engine handles)
    model.set_experts_implementation("eager")
    return model


def save_checkpoint(
    directory: Path, seed: int = 0, *, max_shard_size: str | None = None, **overrides: Any
) -> Any:
    """Write a checkpoint into `directory` and return the transformers model that wrote it."""
    model = make_reference(seed, **overrides)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    return model


def greedy_reference(model: Any, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy continuation by full recomputation with transformers' forward: [B, steps]."""
    seq = ids
    with torch.no_grad():
        for _ in range(steps):
            nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    return seq[:, ids.shape[1] :]
