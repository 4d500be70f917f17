"""Sparse Mixture-of-Experts feed-forward: a full-precision router and grouped expert matmuls.

Routing is transformers' Mixtral router: softmax over all experts in fp32, top-k, then the k
weights renormalised to sum to one (== a softmax over the top-k logits, two ops fewer).

Dispatch has no Python loop over all experts. With N tokens:

- N > 1 (prefill, batched decode): the (token, k) pairs are sorted by expert and the end
  offset of each expert's group comes from the sorted ids. Then, by device and dtype:
  - CPU fp32 (`BlockedExperts`): the experts' weights are reordered once into oneDNN's
    blocked layout (onednn.py) and a host loop runs only the experts that got tokens, one
    blocked product per projection (group ends read on the host: free on CPU).
  - bf16, CUDA (`GroupedExperts`): one `torch._grouped_mm` per projection over the stacked
    weights, no host sync.
  - int8 and int4 (`Int8Experts`, `Int4Experts`): the same host loop as CPU fp32, one
    quantized product per projection (quant.py says why).
  Both host loops are one `ExpertLoop` over per-expert projections (projection.py).
- N == 1 on CPU (batch-1 decode): a loop over the k chosen experts; the routing weight and
  the residual are folded into the second projection.

Why these paths (benchmarks/engine_moe_dispatch.py; the table is in docs/benchmarks.md):
gathering copies each selected expert's weights once per (token, k) pair, which makes
gpt-fast's gather-per-token dispatch far slower. On CPU `_grouped_mm` runs one MKL GEMM per
expert and MKL reads the weight well below the memory's speed for the 1-16 rows an expert
gets in decode; oneDNN's blocked kernel does not (onednn.py), so in fp32 the blocked loop is
the CPU path. In bf16 and on CUDA `_grouped_mm` stays the path.

`_grouped_mm`'s constraints, handled here: offsets are int32, rows must be 16-byte aligned
(hidden and intermediate sizes times the element size divisible by 16), CPU takes fp32/bf16,
CUDA bf16 on sm80+. Other cases use the gather path, which is correct but slow.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import onednn
from .native import NativeKernels, NativeProjection
from .projection import BlockedProjection, DenseProjection, Int4Projection, Int8Projection, Projection
from .quant import Int4Experts, Int8Experts

__all__ = ["BlockedExperts", "ExpertLoop", "GroupedExperts", "MoEFeedForward", "grouped_mm_supported"]


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


Batched = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(xs [S, D] sorted by expert, expert ids [S] sorted, offsets [E] int32 group ends) -> [S, D]."""


class ExpertLoop:
    """The experts as one (w1|w3, w2) projection pair each (projection.py), run one at a time.

    Two uses: batch-1 decode on CPU (`add_one`: the k chosen experts, read on the host), and
    the batched path where a host loop over the experts that got tokens beats `_grouped_mm`
    (`__call__`: CPU fp32 on oneDNN-blocked weights, and int8). Group ends are read on the
    host, which is free on CPU."""

    __slots__ = ("dim", "pairs")

    def __init__(self, pairs: tuple[tuple[Projection, Projection], ...], dim: int) -> None:
        self.pairs, self.dim = pairs, dim

    def __call__(self, xs: torch.Tensor, expert_ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        out = torch.empty((xs.shape[0], self.dim), dtype=xs.dtype, device=xs.device)
        start = 0
        for (w13, w2), end in zip(self.pairs, offsets.tolist(), strict=True):
            if end > start:
                gate, up = w13(xs[start:end]).chunk(2, dim=-1)
                out[start:end] = w2(F.silu(gate).mul_(up))
            start = end
        return out

    def add_one(self, x: torch.Tensor, expert: int, weight: float, out: torch.Tensor) -> torch.Tensor:
        """out + weight * expert(x) for one token x [1, D] -> [1, D]."""
        w13, w2 = self.pairs[expert]
        gate, up = w13(x).chunk(2, dim=-1)
        return w2.add(out, F.silu(gate).mul_(up), alpha=weight)


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


class BlockedExperts(nn.Module):
    """CPU fp32 experts on oneDNN-blocked weights (see onednn.py), or on the native kernels'
    packed weights (native.py) when the model runs the native path: an `ExpertLoop` of
    `BlockedProjection`s or `NativeProjection`s. Made from loaded `GroupedExperts` by
    `MoEFeedForward.bind`, which then drops the stacked weights (the copies replace them)."""

    def __init__(self, experts: GroupedExperts, kernels: NativeKernels | None = None) -> None:
        super().__init__()
        pairs = zip(experts.w13.unbind(0), experts.w2.unbind(0), strict=True)
        make: Callable[[torch.Tensor], Projection] = (
            BlockedProjection if kernels is None else lambda w: NativeProjection(w, kernels)
        )
        self.loop = ExpertLoop(tuple((make(a), make(b)) for a, b in pairs), experts.w2.shape[1])

    def forward(self, xs: torch.Tensor, expert_ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.loop(xs, expert_ids, offsets)


def _expert_loop(experts: nn.Module) -> ExpertLoop:
    """The per-expert projections of loaded experts, as views of their weights (no copies)."""
    if isinstance(experts, BlockedExperts):
        return experts.loop
    if isinstance(experts, Int8Experts):
        w13 = zip(experts.w13_weight.unbind(0), experts.w13_scales.unbind(0), strict=True)
        w2 = zip(experts.w2_weight.unbind(0), experts.w2_scales.unbind(0), strict=True)
        pairs = tuple((Int8Projection(*a), Int8Projection(*b)) for a, b in zip(w13, w2, strict=True))
        return ExpertLoop(pairs, experts.w2_weight.shape[1])
    if isinstance(experts, Int4Experts):
        p13, p2 = experts.w13_packed, experts.w2_packed
        w13 = zip(experts.w13_weight.unbind(0), experts.w13_scales_zeros.unbind(0), strict=True)
        w2 = zip(experts.w2_weight.unbind(0), experts.w2_scales_zeros.unbind(0), strict=True)
        pairs4 = tuple(
            (Int4Projection(*a, p13), Int4Projection(*b, p2)) for a, b in zip(w13, w2, strict=True)
        )
        return ExpertLoop(pairs4, experts.w2_weight.shape[1])
    assert isinstance(experts, GroupedExperts)
    dense = zip(experts.w13.unbind(0), experts.w2.unbind(0), strict=True)
    return ExpertLoop(tuple((DenseProjection(a), DenseProjection(b)) for a, b in dense), experts.w2.shape[1])


class MoEFeedForward(nn.Module):
    def __init__(self, experts: nn.Module, dim: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, num_experts, bias=False)  # router, always kept full precision
        self.experts = experts
        self.num_experts, self.top_k = num_experts, top_k
        # (router weight, batched experts, expert loop, arange(E)) as plain references, made by
        # bind(): a tuple is not registered as a parameter or submodule, and reading it skips
        # the ~1 us nn.Module attribute lookup
        self._bound: tuple[torch.Tensor, Batched, ExpertLoop, torch.Tensor] | None = None

    def bind(self, kernels: NativeKernels | None = None) -> None:
        """Make the hot path's references once the weights are real. In fp32 on a CPU with
        oneDNN (or on the native path, `kernels`) the stacked experts are reordered into
        blocked (packed) weights and released."""
        if isinstance(self.experts, GroupedExperts) and (
            (kernels is not None and self.experts.w13.dtype == torch.float32)
            or onednn.available(self.experts.w13)
        ):
            self.experts = BlockedExperts(self.experts, kernels)
        loop = _expert_loop(self.experts)
        batched: Batched = self.experts if isinstance(self.experts, GroupedExperts) else loop
        gate = self.gate.weight
        self._bound = (gate, batched, loop, torch.arange(self.num_experts, device=gate.device))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """x [N, D] (normed), residual [N, D] -> residual + MoE(x) [N, D]."""
        assert self._bound is not None, "bind() first"
        gate, batched, loop, expert_range = self._bound  # gate: full precision, also in int8 models
        logits = F.linear(x if x.dtype == gate.dtype else x.to(gate.dtype), gate)  # [N, E]
        top, chosen = torch.topk(logits, self.top_k, dim=-1)  # [N, k]
        weights = torch.softmax(top, dim=-1, dtype=torch.float32)
        if x.shape[0] == 1 and x.device.type == "cpu":  # see the module docstring
            out = residual
            for e, w in zip(chosen[0].tolist(), weights[0].tolist(), strict=True):
                out = loop.add_one(x, e, w, out)
            return out

        expert_ids, order = torch.sort(chosen.view(-1), stable=True)  # [S = N k]
        offsets = torch.searchsorted(expert_ids, expert_range, right=True, out_int32=True)
        token = order // self.top_k  # the token of each sorted (token, k) pair
        ys = batched(x[token], expert_ids, offsets)  # [S, D], sorted by expert
        ys = ys * weights.view(-1, 1)[order]  # fp32: weighted sums in fp32, as transformers
        if ys.dtype == residual.dtype:
            return residual.index_add(0, token, ys)
        out = torch.zeros((x.shape[0], x.shape[1]), dtype=ys.dtype, device=x.device).index_add_(0, token, ys)
        return residual + out.to(residual.dtype)
