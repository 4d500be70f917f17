"""The Mixtral network as plain modules: embeddings, decoder blocks, final norm, lm head.

Built on the meta device and filled by `load_state_dict(assign=True)` (see loading.py); the
only buffer it computes itself is RoPE's inverse frequencies (`init_buffers`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention, AttentionStep
from .config import ModelConfig
from .moe import GroupedExperts, MoEFeedForward
from .rope import RopeTable, inverse_frequencies

__all__ = ["RMSNorm", "Transformer"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # one fused op; for bf16 it normalises in fp32 internally, like transformers' upcast
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, experts: nn.Module) -> None:
        super().__init__()
        c = config
        self.attention_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.attention = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        self.ffn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.moe = MoEFeedForward(experts, c.hidden_size, c.num_local_experts, c.num_experts_per_tok)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, step: AttentionStep, layer: int
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, step, layer)
        return h + self.moe(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, *, grouped_experts: bool = True) -> None:
        super().__init__()
        c = config
        self.config = c
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(
            Block(
                c,
                GroupedExperts(
                    c.num_local_experts, c.hidden_size, c.intermediate_size, grouped=grouped_experts
                ),
            )
            for _ in range(c.num_hidden_layers)
        )
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.output: nn.Module = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.rope: RopeTable | None = None  # made by init_buffers once the weights are real

    def init_buffers(self, device: torch.device) -> None:
        """Compute what the checkpoint does not store (RoPE tables), in the embeddings' dtype."""
        inv_freq = inverse_frequencies(self.config.head_dim, self.config.rope_theta, device)
        self.rope = RopeTable(inv_freq, self.tok_embeddings.weight.dtype)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        step: AttentionStep,
        *,
        span: int,
        last_only: bool,
    ) -> torch.Tensor:
        """tokens, positions [B, T] (every position < span) -> fp32 logits [B, T, V] ([B, V] if last_only)."""
        assert self.rope is not None, "init_buffers() first"
        x = self.tok_embeddings(tokens)  # [B, T, D]
        cos, sin = self.rope.lookup(positions, span)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, step, i)
        if last_only:
            x = x[:, -1]
        return self.output(self.norm(x)).float()
