"""A small deterministic Mixtral checkpoint whose answers are made of the prompt's words.

Random weights answer with random word pieces, which makes prompt-response relevance
meaningless in a demo. This checkpoint is built by hand, in the Hugging Face Mixtral
format (config.json, model.safetensors with transformers' key names, tokenizer.json), so
any Mixtral loader serves it. It is a "copy-back" model:

- each token embedding is a random unit vector (the token part, `hidden_size - 1` dims)
  plus one constant channel that carries no token information;
- layer 0's attention reads only the constant channel for queries and keys, so its
  scores depend on positions alone: through RoPE, query head h scores key position s by
  `sum_i A^2 cos(theta_i * (t - s - lag_h))`, sharply peaked at `s = t - lag_h` (the
  nearest available position when the prompt is shorter). Values are the token part
  (one KV head, GQA): each head copies the embedding of the token `lag_h` back, times
  its gain; two heads with negative gains on lags 0 and 1 keep it from repeating itself;
- layer 1's attention is switched off; both layers' experts are small random SwiGLU MLPs
  behind a random router (a little noise through the real grouped dispatch);
- `lm_head` is the token part of the embeddings times `logit_scale`: the copied tokens
  score highest, so a sampled answer is a shuffle of the prompt's words, not language but
  on topic. A unigram prior (also through the constant channel) prefers content words to
  punctuation, word pieces and function words. `[SEP]` (end of sequence) gets a constant
  logit, as likely as a copied function word over `mean_answer_tokens - 1`: a sampled answer
  ends soon after its window of copies holds no content word (greedy ones run to the budget).

The "corrupted" variant permutes the rows of `lm_head` (EOS excepted), so it answers with
unrelated words: a bad release for the demo to catch. The tokenizer is the WordPiece
tokenizer of all-MiniLM-L6-v2 (the caller passes that model's directory: the engine does
not know where the monitor's model lives), with padding, truncation and the [CLS]/[SEP]
template removed.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

__all__ = ["DEMO_EOS_TOKEN", "SMALL_DEMO", "DemoSpec", "write_demo_checkpoint"]

DEMO_EOS_TOKEN = "[SEP]"
# English function words: the demo model's prior prefers the content words of a prompt.
_FUNCTION_WORDS = frozenset(
    [
        "a",
        "about",
        "after",
        "again",
        "all",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "been",
        "before",
        "being",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "for",
        "from",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "him",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "just",
        "me",
        "might",
        "more",
        "most",
        "my",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)


@dataclass(frozen=True, slots=True)
class DemoSpec:
    hidden_size: int = 256
    # layer 0 copies; every later layer's attention is off (its experts add a little noise)
    num_hidden_layers: int = 2
    # one query head per (lag, gain): positive gains copy the token `lag` back, negative ones
    # suppress it (lags 0 and 1: the model does not repeat what it just said)
    heads: tuple[tuple[int, float], ...] = ((3, 2.0), (5, 2.0), (8, 2.0), (13, 2.0), (0, -2.0), (1, -2.0))
    num_local_experts: int = 4
    num_experts_per_tok: int = 2
    intermediate_size: int = 128
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    logit_scale: float = 40.0  # sharpness of the preference for copied tokens
    attention_sharpness: float = 48.0  # A^2 per RoPE pair: how strictly a head keeps its lag
    min_rope_frequency: float = 0.02  # pairs slower than this carry no position signal
    mean_answer_tokens: float = 16.0
    function_word_penalty: float = 3.0  # logit prior against punctuation, word pieces, function words
    expert_scale: float = 0.02  # size of the experts' (noise) contribution
    seed: int = 0


# The fast path's model for SLA routing: the same copy-back behaviour with half the width and
# one layer (lm_head, [V, hidden], is most of a decode step's work). See docs/benchmarks/engine.md.
SMALL_DEMO = DemoSpec(hidden_size=128, num_hidden_layers=1)


def write_demo_checkpoint(
    out_dir: str | os.PathLike[str],
    minilm_dir: str | os.PathLike[str],
    *,
    corrupted: bool = False,
    spec: DemoSpec | None = None,
) -> Path:
    """Write config.json, model.safetensors and tokenizer.json into `out_dir` (created).
    `minilm_dir` holds all-MiniLM-L6-v2's tokenizer.json. Same arguments, same bytes."""
    spec = spec or DemoSpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _plain_tokenizer(Path(minilm_dir) / "tokenizer.json")
    vocab = tokenizer["model"]["vocab"]
    vocab_size = max(vocab.values()) + 1
    eos = vocab[DEMO_EOS_TOKEN]
    prior = _prior(vocab, vocab_size, eos, spec.function_word_penalty)
    tensors = _weights(spec, vocab_size, eos, prior, corrupted=corrupted)
    config = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": len(spec.heads),
        "num_key_value_heads": 1,
        "head_dim": spec.hidden_size,
        "num_local_experts": spec.num_local_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": spec.rope_theta,
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


def _plain_tokenizer(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    data["padding"] = None
    data["truncation"] = None
    data["post_processor"] = None  # no [CLS] ... [SEP] around prompts: [SEP] ends answers
    return data


def _prior(vocab: dict[str, int], vocab_size: int, eos: int, penalty: float) -> torch.Tensor:
    """A unigram logit prior [V]: 0 for content words, -penalty for the rest."""
    prior = torch.full((vocab_size,), -penalty)
    for token, index in vocab.items():
        if token.isascii() and token.isalpha() and token.islower() and token not in _FUNCTION_WORDS:
            prior[index] = 0.0
    prior[eos] = 0.0
    return prior


def _weights(
    spec: DemoSpec, vocab_size: int, eos: int, prior: torch.Tensor, *, corrupted: bool
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(spec.seed)
    d, heads = spec.hidden_size, len(spec.heads)
    tok, const = d - 1, d - 1  # token part: dims [0, d-1); constant channel: dim d-1
    half = math.sqrt(d / 2)  # token part and constant channel share the unit RMS equally
    unit = torch.randn(vocab_size, tok, generator=g)
    unit = unit / unit.norm(dim=1, keepdim=True)  # [V, d-1]

    embed = torch.empty(vocab_size, d)
    embed[:, :tok] = unit * half
    embed[:, const] = half  # RMSNorm leaves every embedding as it is (RMS 1)

    # layer 0: position-only queries/keys on the constant channel, values = the token part
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))  # [d/2]
    amp = torch.where(inv_freq >= spec.min_rope_frequency, math.sqrt(spec.attention_sharpness), 0.0)
    pairs = d // 2
    k_proj = torch.zeros(d, d)
    k_proj[:pairs, const] = (amp / half).float()  # k0 = (A, 0) in every pair
    q_proj = torch.zeros(heads * d, d)
    for h, (lag, _) in enumerate(spec.heads):
        angle = -inv_freq * lag  # q0 = A e^{-i theta lag}: score peaks at t - s = lag
        q_proj[h * d : h * d + pairs, const] = (amp * angle.cos() / half).float()
        q_proj[h * d + pairs : (h + 1) * d, const] = (amp * angle.sin() / half).float()
    v_proj = torch.zeros(d, d)
    v_proj[:tok, :tok] = torch.eye(tok)
    o_proj = torch.zeros(d, heads * d)
    for h, (_, gain) in enumerate(spec.heads):
        o_proj[:tok, h * d : h * d + tok] = torch.eye(tok) * gain

    # lm_head: logit = scale * cos(token, copied mixture); EOS: a constant logit
    lm_head = torch.zeros(vocab_size, d)
    lm_head[:, :tok] = unit * spec.logit_scale / math.sqrt(d)
    if corrupted:
        order = torch.randperm(vocab_size, generator=g)
        lm_head = lm_head[order]
    mix = 2.0 + sum(gain**2 for _, gain in spec.heads)  # RMS^2 of the final residual, times 2
    copies = [gain for _, gain in spec.heads if gain > 0]
    copy_logit = spec.logit_scale * max(copies) / math.sqrt(mix)
    # as likely as a copied function word over (mean - 1) steps: answers end once the
    # copy-back window holds no content word any more
    eos_logit = (
        copy_logit
        - spec.function_word_penalty
        + math.log(len(copies) / max(spec.mean_answer_tokens - 1.0, 1.0))
    )
    channel = math.sqrt(d / mix)  # the constant channel's value after the final norm
    lm_head[:, const] = prior / channel
    lm_head[eos] = 0.0
    lm_head[eos, const] = eos_logit / channel

    tensors = {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": torch.ones(d),
        "lm_head.weight": lm_head,
    }
    for layer in range(spec.num_hidden_layers):
        p = f"model.layers.{layer}"
        on = layer == 0
        tensors[f"{p}.input_layernorm.weight"] = torch.ones(d)
        tensors[f"{p}.post_attention_layernorm.weight"] = torch.ones(d)
        tensors[f"{p}.self_attn.q_proj.weight"] = q_proj if on else torch.zeros_like(q_proj)
        tensors[f"{p}.self_attn.k_proj.weight"] = k_proj if on else torch.zeros_like(k_proj)
        tensors[f"{p}.self_attn.v_proj.weight"] = v_proj if on else torch.zeros_like(v_proj)
        tensors[f"{p}.self_attn.o_proj.weight"] = o_proj if on else torch.zeros_like(o_proj)
        tensors.update(_experts(p, spec, g))
    return {k: v.contiguous() for k, v in tensors.items()}


def _experts(prefix: str, spec: DemoSpec, g: torch.Generator) -> dict[str, torch.Tensor]:
    d, inter = spec.hidden_size, spec.intermediate_size
    out = {
        f"{prefix}.block_sparse_moe.gate.weight": torch.randn(spec.num_local_experts, d, generator=g)
        / math.sqrt(d)
    }
    for e in range(spec.num_local_experts):
        q = f"{prefix}.block_sparse_moe.experts.{e}"
        out[f"{q}.w1.weight"] = torch.randn(inter, d, generator=g) / math.sqrt(d)
        out[f"{q}.w3.weight"] = torch.randn(inter, d, generator=g) / math.sqrt(d)
        out[f"{q}.w2.weight"] = torch.randn(d, inter, generator=g) * spec.expert_scale / math.sqrt(inter)
    return out
