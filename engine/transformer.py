"""The Mixtral network as plain modules: embeddings, decoder blocks, final norm, lm head.

Built on the meta device and filled by `load_state_dict(assign=True)` (see loading.py); the
only buffer it computes itself is RoPE's inverse frequencies (`init_buffers`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention, AttentionStep
from .config import ModelConfig
from .moe import GroupedExperts, MoEFeedForward
from .native import NativeKernels
from .projection import Projection, projection
from .rope import RopeTable, inverse_frequencies

__all__ = ["RMSNorm", "Transformer"]


class RMSNorm(nn.Module):
    """An RMSNorm's weight; `Transformer.forward` applies it with `rms_norm`."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, eps_t: torch.Tensor) -> torch.Tensor:
    """x [..., D] / sqrt(mean(x^2) + eps) * weight; `eps_t` is eps as a [1, 1, 1] fp32 tensor."""
    if x.dtype != torch.float32:  # one fused op; normalises in fp32 internally, like transformers' upcast
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    # fp32: eps + sum(x^2)/D as one batched dot product, then rsqrt and two multiplies in
    # place: 13 us against F.rms_norm's 16-29 us at [1-8, 256-512] here (F.rms_norm runs
    # about eight kernels on CPU)
    rows = x.reshape(-1, 1, x.shape[-1])  # [N, 1, D]
    mean_sq = torch.baddbmm(eps_t, rows, rows.transpose(1, 2), alpha=1.0 / x.shape[-1])
    return torch.mul(rows, mean_sq.rsqrt_()).mul_(weight).view(x.shape)


class Block(nn.Module):
    """The parameters of one decoder layer; `Transformer.forward` runs it."""

    def __init__(self, config: ModelConfig, experts: nn.Module) -> None:
        super().__init__()
        c = config
        self.attention_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.attention = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        self.ffn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.moe = MoEFeedForward(experts, c.hidden_size, c.num_local_experts, c.num_experts_per_tok)


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
        self._bound: _Bound | None = None

    def init_buffers(self, device: torch.device, kernels: NativeKernels | None = None) -> None:
        """Once the weights are real: compute what the checkpoint does not store (RoPE tables,
        in the embeddings' dtype) and bind the hot path's plain references to the weights
        (on the native kernels' packed copies when `kernels` is given: paths.py)."""
        inv_freq = inverse_frequencies(self.config.head_dim, self.config.rope_theta, device)
        self.rope = RopeTable(inv_freq, self.tok_embeddings.weight.dtype)
        layers = []
        for block in self.layers:
            assert isinstance(block, Block)
            block.attention.bind(kernels)
            block.moe.bind(kernels)
            layers.append((block.attention_norm.weight, block.attention, block.ffn_norm.weight, block.moe))
        eps = self.config.rms_norm_eps
        self._bound = _Bound(
            self.tok_embeddings.weight,
            tuple(layers),
            self.norm.weight,
            projection(self.output, head=True, kernels=kernels),
            (eps, torch.full((1, 1, 1), eps, device=device)),
        )

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
        assert self.rope is not None and self._bound is not None, "init_buffers() first"
        embeddings, layers, norm, head, eps = self._bound
        B, T = tokens.shape
        x = F.embedding(tokens, embeddings)  # [B, T, D]
        cos, sin = self.rope.lookup(positions, span, step.write_at)
        for i, (attention_norm, attention, ffn_norm, moe) in enumerate(layers):
            # .forward: the modules' own __call__ adds ~1.3 us each for hooks that are never set
            h = attention.forward(rms_norm(x, attention_norm, *eps), x.view(B * T, -1), cos, sin, step, i)
            x = moe.forward(rms_norm(h, ffn_norm, *eps), h).view(B, T, -1)  # [B, T, D]
        if last_only:
            x = x[:, -1]  # [B, D]
        return head(rms_norm(x, norm, *eps).reshape(-1, x.shape[-1])).float().view(*x.shape[:-1], -1)


class _Bound(NamedTuple):
    """The weights the forward reads, as plain references (nn.Module attribute lookups and
    `__call__` cost ~1-1.5 us each here; a decode step of the small model is ~1 ms)."""

    embeddings: torch.Tensor  # [V, D]
    layers: tuple[tuple[torch.Tensor, Attention, torch.Tensor, MoEFeedForward], ...]
    norm: torch.Tensor  # [D]
    head: Projection
    eps: tuple[float, torch.Tensor]  # the norms' eps, and as a [1, 1, 1] fp32 tensor (rms_norm)
