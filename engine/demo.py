"""A small deterministic Mixtral checkpoint whose answers are related to the prompt.

Random weights would answer with random word pieces, which makes prompt-response
relevance meaningless in a demo. This checkpoint is a "bag-of-words echo" built by hand,
in the Hugging Face Mixtral format (config.json, model.safetensors with transformers' key
names, tokenizer.json), so any Mixtral loader serves it:

- token embeddings are random unit-RMS vectors, nearly orthogonal in `hidden_size` dims;
- `q_proj = k_proj = 0`, so every head attends uniformly over the prefix, and
  `v_proj = I`, `o_proj = echo_gain * I` (multi-head, no GQA, so the whole vector passes):
  each layer adds the mean of the prefix's (normalised) token embeddings to the residual;
- experts are small random SwiGLU MLPs (a little noise, real grouped dispatch), the router
  is random;
- `lm_head` is the embedding matrix with unit rows times `logit_scale`, so a token's logit
  is its similarity to that mean: the words of the prompt (and of the answer so far) score
  highest, the rest of the vocabulary is noise of spread ~ 1/sqrt(tokens so far).

Sampled answers are therefore mostly words of the prompt: not language, but on topic.
The "corrupted" variant permutes the rows of `lm_head`, so it answers with unrelated words
(a bad release for the demo to catch). The tokenizer is the WordPiece tokenizer of
all-MiniLM-L6-v2 (its path is passed in: the engine does not know where the monitor's
model lives), with padding, truncation and the [CLS]/[SEP] template removed; `[SEP]` is
the end-of-sequence token.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

__all__ = ["DEMO_EOS_TOKEN", "DemoSpec", "write_demo_checkpoint"]

DEMO_EOS_TOKEN = "[SEP]"
_MINILM_WORDS = "embeddings.word_embeddings.weight"


@dataclass(frozen=True, slots=True)
class DemoSpec:
    hidden_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_local_experts: int = 4
    num_experts_per_tok: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 4096
    echo_gain: float = 4.0  # weight of the prefix mean against the current token
    echo_layers: int = 1  # layers whose attention adds the prefix mean (the others add nothing)
    logit_scale: float = 16.0  # sharpness of the preference for prefix words
    expert_scale: float = 0.02  # size of the experts' (noise) contribution
    seed: int = 0


def write_demo_checkpoint(
    out_dir: str | os.PathLike[str],
    minilm_dir: str | os.PathLike[str],
    *,
    corrupted: bool = False,
    spec: DemoSpec | None = None,
) -> Path:
    """Write config.json, model.safetensors and tokenizer.json into `out_dir` (created).
    The same arguments always give the same bytes."""
    spec = spec or DemoSpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _plain_tokenizer(Path(minilm_dir) / "tokenizer.json")
    vocab = tokenizer["model"]["vocab"]
    vocab_size = max(vocab.values()) + 1
    eos = vocab[DEMO_EOS_TOKEN]
    words = _word_vectors(Path(minilm_dir) / "model.safetensors", vocab_size, spec.hidden_size)
    tensors = _weights(spec, words, corrupted=corrupted)
    config = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_attention_heads,
        "head_dim": spec.hidden_size // spec.num_attention_heads,
        "num_local_experts": spec.num_local_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "bos_token_id": vocab["[CLS]"],
        "eos_token_id": eos,
        "pad_token_id": vocab["[PAD]"],
        "torch_dtype": "float32",
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False) + "\n")
    return out


def _plain_tokenizer(path: Path) -> dict:  # type: ignore[type-arg]
    data = json.loads(path.read_text())
    data["padding"] = None
    data["truncation"] = None
    data["post_processor"] = None  # no [CLS] ... [SEP] around prompts: [SEP] ends answers
    return data  # type: ignore[no-any-return]


def _word_vectors(path: Path, vocab_size: int, hidden: int) -> torch.Tensor:
    """MiniLM's input word-piece embeddings, centred, reduced to `hidden` dims by PCA,
    with unit rows: [V, hidden]."""
    with safe_open(str(path), "pt") as f:
        words = f.get_tensor(_MINILM_WORDS).to(torch.float64)
    if words.shape[0] != vocab_size or words.shape[1] < hidden:
        raise ValueError(
            f"{path}: word embeddings {tuple(words.shape)} do not fit vocab {vocab_size}, hidden {hidden}"
        )
    words = words - words.mean(dim=0)
    if hidden < words.shape[1]:
        _, _, vh = torch.linalg.svd(words, full_matrices=False)
        words = words @ vh[:hidden].T
    return (words / words.norm(dim=1, keepdim=True)).to(torch.float32)


def _weights(spec: DemoSpec, unit: torch.Tensor, *, corrupted: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(spec.seed)
    d, inter, experts = spec.hidden_size, spec.intermediate_size, spec.num_local_experts
    vocab_size = unit.shape[0]
    embed = unit * math.sqrt(d)  # unit RMS: RMSNorm leaves it as it is
    lm_head = unit * spec.logit_scale / math.sqrt(d)
    if corrupted:
        lm_head = lm_head[torch.randperm(vocab_size, generator=g)]
    eye = torch.eye(d)
    tensors = {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": torch.ones(d),
        "lm_head.weight": lm_head,
    }
    for layer in range(spec.num_hidden_layers):
        p = f"model.layers.{layer}"
        tensors[f"{p}.input_layernorm.weight"] = torch.ones(d)
        tensors[f"{p}.post_attention_layernorm.weight"] = torch.ones(d)
        tensors[f"{p}.self_attn.q_proj.weight"] = torch.zeros(d, d)
        tensors[f"{p}.self_attn.k_proj.weight"] = torch.zeros(d, d)
        tensors[f"{p}.self_attn.v_proj.weight"] = eye.clone()
        tensors[f"{p}.self_attn.o_proj.weight"] = eye * (spec.echo_gain if layer < spec.echo_layers else 0.0)
        tensors[f"{p}.block_sparse_moe.gate.weight"] = torch.randn(experts, d, generator=g) / math.sqrt(d)
        for e in range(experts):
            q = f"{p}.block_sparse_moe.experts.{e}"
            tensors[f"{q}.w1.weight"] = torch.randn(inter, d, generator=g) / math.sqrt(d)
            tensors[f"{q}.w3.weight"] = torch.randn(inter, d, generator=g) / math.sqrt(d)
            tensors[f"{q}.w2.weight"] = (
                torch.randn(d, inter, generator=g) * spec.expert_scale / math.sqrt(inter)
            )
    return {k: v.contiguous() for k, v in tensors.items()}
