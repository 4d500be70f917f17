"""Sparse Mixture-of-Experts feed-forward: a full-precision router and grouped expert matmuls.

Routing is transformers' Mixtral router: softmax over all experts in fp32, top-k, then the k
weights renormalised to sum to one. Dispatch has no Python loop over experts: the (token, k)
pairs are sorted by expert, the end offset of each expert's group comes from the sorted ids,
and each projection is one `torch._grouped_mm` over the stacked weights.

Why `_grouped_mm`: benchmarks/engine_moe_dispatch.py, torch 2.13, 1 thread of the shared
2-core machine, E=8 top-2, fresh routing per call, ms per layer (median CPU time):

    D=512 I=1024, tokens    1      8      64
    _grouped_mm           1.91   8.03   15.5    <- this module
    loop over active      2.08   8.23   16.2    (a Python loop; group sizes read on the host)
    gather-per-token      8.38   139    911     (gpt-fast's w1[expert_indices] + bmm)

Gathering copies each selected expert's weights once per (token, k) pair, which is what
makes it 4-60x slower; `_grouped_mm` reads each active expert once per call, is never slower
than the loop, and needs no host sync (the group ends stay on the device). Its constraints,
handled here: offsets are int32, rows must be 16-byte aligned (hidden and intermediate sizes
times the element size divisible by 16), CPU takes fp32/bf16, CUDA bf16 on sm80+. Other
cases use the gather path, which is correct but slow.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GroupedExperts", "MoEFeedForward", "grouped_mm_supported"]


def grouped_mm_supported(hidden: int, intermediate: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `torch._grouped_mm` takes stacked expert weights of these sizes on `device`."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device.type == "cuda":  # bf16 kernels on Ampere (sm80) and later
        if dtype != torch.bfloat16 or torch.cuda.get_device_capability(device) < (8, 0):
            return False
    elif device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    size = torch.empty((), dtype=dtype).element_size()
    return (hidden * size) % 16 == 0 and (intermediate * size) % 16 == 0


class GroupedExperts(nn.Module):
    """E SwiGLU experts as two stacked weights: w13 [E, 2I, D] (w1 rows, then w3) and w2 [E, D, I]."""

    def __init__(self, experts: int, dim: int, intermediate: int, *, grouped: bool = True) -> None:
        super().__init__()
        self.w13 = nn.Parameter(torch.empty(experts, 2 * intermediate, dim), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(experts, dim, intermediate), requires_grad=False)
        self.grouped = grouped

    def forward(self, xs: torch.Tensor, expert_ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """xs [S, D] sorted by expert, expert_ids [S] sorted, offsets [E] int32 group ends -> [S, D]."""
        if self.grouped:
            h = torch._grouped_mm(xs, self.w13.transpose(-2, -1), offs=offsets)  # [S, 2I]
            gate, up = h.chunk(2, dim=-1)
            return torch._grouped_mm(F.silu(gate) * up, self.w2.transpose(-2, -1), offs=offsets)
        h = torch.einsum("sd,sod->so", xs, self.w13[expert_ids])  # gather fallback, odd sizes
        gate, up = h.chunk(2, dim=-1)
        return torch.einsum("si,sdi->sd", F.silu(gate) * up, self.w2[expert_ids])


class MoEFeedForward(nn.Module):
    def __init__(self, experts: nn.Module, dim: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, num_experts, bias=False)  # router, always kept full precision
        self.experts = experts
        self.num_experts, self.top_k = num_experts, top_k
        self._range: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [N, D]
        gate = self.gate.weight  # full precision, also in int8 models
        logits = F.linear(x if x.dtype == gate.dtype else x.to(gate.dtype), gate)  # [N, E]
        # softmax over all E, top-k, renormalise == softmax over the top-k logits (2 ops fewer)
        top, chosen = torch.topk(logits, self.top_k, dim=-1)  # [N, k]
        weights = torch.softmax(top, dim=-1, dtype=torch.float32)

        expert_ids, order = torch.sort(chosen.view(-1), stable=True)  # [S = N k]
        offsets = torch.searchsorted(expert_ids, self._expert_range(x.device), right=True, out_int32=True)
        token = order // self.top_k  # the token of each sorted (token, k) pair
        ys = self.experts(x[token], expert_ids, offsets)  # [S, D], sorted by expert
        ys = ys * weights.view(-1, 1)[order]  # fp32: weighted sums in fp32, as transformers
        out = torch.zeros((x.shape[0], shape[-1]), dtype=ys.dtype, device=x.device).index_add_(0, token, ys)
        return (out if out.dtype == x.dtype else out.to(x.dtype)).view(shape)

    def _expert_range(self, device: torch.device) -> torch.Tensor:
        """arange(E) on `device`, made once: the values whose group ends searchsorted finds."""
        if self._range is None or self._range.device != device:
            self._range = torch.arange(self.num_experts, device=device)
        return self._range
