"""Weight-only int8: per-output-channel scales for attention, experts and the lm head.

The router gate stays full precision (a flipped expert choice costs far more than a rounded
weight). Each weight row n is stored as round(w[n] / s[n]) in int8 with s[n] = max|w[n]| / 127.

On CPU the matmul is `torch._weight_int8pack_mm`, which is fast only with bf16 activations
(with fp32 activations it is slower than fp32 `F.linear`; docs/benchmarks.md),
so `load` runs int8 models with bf16 activations on CPU. The kernel crashes (SIGSEGV,
torch 2.13) when the reduction size is not a multiple of 16 and refuses empty inputs; those
cases, and other devices, dequantize on the fly instead.

Experts: the sorted (token, k) groups are contiguous, so each active expert is one
`_weight_int8pack_mm` on its slice (the loop runs over active groups only, at most tokens*k,
and reading their sizes is free on CPU). Dequantizing the active experts into a bf16
`_grouped_mm` is slower: the conversion costs more than the matmul it feeds, and reading a
quarter of the bytes is what wins at decode sizes (benchmarks/engine_moe_dispatch.py; the
figures are in docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["QUANTIZERS", "Int8Experts", "Int8Linear", "int8_rows", "quantize_network"]


def int8_rows(w: torch.Tensor, scale_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """w [..., N, K] -> {"weight": int8 [..., N, K], "scales": [..., N] in `scale_dtype`}."""
    w = w.float()
    scales = (w.abs().amax(dim=-1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(w / scales.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return {"weight": q, "scales": scales.to(scale_dtype)}


# scheme -> (weight [..., N, K], activation dtype) -> the tensors its modules store
QUANTIZERS: dict[str, Callable[..., dict[str, torch.Tensor]]] = {"int8": int8_rows}


def _packed_kernel_ok(x: torch.Tensor, k: int) -> bool:
    return x.device.type == "cpu" and k % 16 == 0 and x.shape[0] > 0


def int8_matmul(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ dequant(weight [N, K], scales [N]).T -> [M, N] in x's dtype."""
    if _packed_kernel_ok(x, weight.shape[1]):
        return torch._weight_int8pack_mm(x.contiguous(), weight, scales)
    return F.linear(x, weight.to(x.dtype)) * scales


class Int8Linear(nn.Module):
    weight: torch.Tensor  # int8 [N, K]
    scales: torch.Tensor  # [N], activation dtype

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.empty(out_features, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = int8_matmul(x.reshape(-1, self.in_features), self.weight, self.scales)
        return y.view(*x.shape[:-1], self.out_features)


class Int8Experts(nn.Module):
    """int8 twin of `GroupedExperts`: w13 [E, 2I, D], w2 [E, D, I] with per-row scales. It holds
    the weights; `MoEFeedForward` runs them as an `ExpertLoop` of per-expert int8 products."""

    w13_weight: torch.Tensor
    w13_scales: torch.Tensor
    w2_weight: torch.Tensor
    w2_scales: torch.Tensor

    def __init__(self, experts: int, dim: int, intermediate: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("w13_weight", torch.empty(experts, 2 * intermediate, dim, dtype=torch.int8))
        self.register_buffer("w13_scales", torch.empty(experts, 2 * intermediate, dtype=dtype))
        self.register_buffer("w2_weight", torch.empty(experts, dim, intermediate, dtype=torch.int8))
        self.register_buffer("w2_scales", torch.empty(experts, dim, dtype=dtype))


def quantize_network(network: nn.Module, scheme: str, *, activation_dtype: torch.dtype) -> None:
    """Swap the modules of a (meta-device) `Transformer` for their int8 twins, in place."""
    from .transformer import Block, Transformer

    assert isinstance(network, Transformer) and scheme in QUANTIZERS
    c = network.config

    def linear(old: nn.Module) -> Int8Linear:
        assert isinstance(old, nn.Linear)
        return Int8Linear(old.in_features, old.out_features, activation_dtype)

    network.output = linear(network.output)
    for block in network.layers:
        assert isinstance(block, Block)
        block.attention.wqkv = linear(block.attention.wqkv)
        block.attention.wo = linear(block.attention.wo)
        block.moe.experts = Int8Experts(
            c.num_local_experts, c.hidden_size, c.intermediate_size, activation_dtype
        )
