"""Sparse Mixture-of-Experts feed-forward: a full-precision router and grouped expert matmuls.

Routing is transformers' Mixtral router: softmax over all experts in fp32, top-k, then the k
weights renormalised to sum to one. Dispatch has no Python loop over experts: the (token, k)
pairs are sorted by expert, the end offset of each expert's group comes from the sorted ids,
and each projection is one `torch._grouped_mm` over the stacked weights.

Why `_grouped_mm` (torch 2.13, CPU, fp32, E=8 D=512 I=1024 top-2, ms per MoE call, measured
on the 2-core machine by the micro-benchmark quoted in docs/benchmarks.md):

    tokens             1       8      64
    _grouped_mm      0.78    2.94   11.6
    gather-per-token 3.80    67.8    577    (gpt-fast's w1[expert_indices], then einsum)
    loop over active 0.83    3.63   13.3    (needs the group sizes on the host: a sync on GPU)

Gathering copies each selected expert's weights once per token (k*3*I*D floats per token),
which is what makes it 5-50x slower; `_grouped_mm` reads each active expert once per call and
skips empty groups. Its constraints, handled here: offsets are int32, and every row stride
must be a multiple of 16 bytes (hidden and intermediate sizes divisible by 16/element size);
checkpoints with odd sizes fall back to the gather path, which is correct but slow.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GroupedExperts", "MoEFeedForward", "grouped_mm_supported"]


def grouped_mm_supported(hidden: int, intermediate: int, dtype: torch.dtype) -> bool:
    """Whether `torch._grouped_mm` accepts the stacked expert weights of these sizes."""
    size = torch.empty((), dtype=dtype).element_size()
    return hasattr(torch, "_grouped_mm") and (hidden * size) % 16 == 0 and (intermediate * size) % 16 == 0


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [N, D]
        logits = F.linear(x.to(self.gate.weight.dtype), self.gate.weight)  # [N, E]
        # softmax over all E, top-k, renormalise == softmax over the top-k logits (2 ops fewer)
        top, chosen = torch.topk(logits, self.top_k, dim=-1)  # [N, k]
        weights = torch.softmax(top.float(), dim=-1)

        expert_ids, order = torch.sort(chosen.view(-1), stable=True)  # [S = N k]
        ends = torch.arange(self.num_experts, device=x.device, dtype=expert_ids.dtype)
        offsets = torch.searchsorted(expert_ids, ends, right=True, out_int32=True)  # [E] group ends
        token = order // self.top_k  # the token of each sorted (token, k) pair
        ys = self.experts(x[token], expert_ids, offsets)  # [S, D], sorted by expert
        ys = ys * weights.view(-1)[order].unsqueeze(-1)  # fp32: weighted sums in fp32, as transformers
        out = torch.zeros((x.shape[0], shape[-1]), dtype=ys.dtype, device=x.device).index_add_(0, token, ys)
        return out.to(x.dtype).view(shape)
