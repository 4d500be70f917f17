"""The Mixtral network, top to bottom: rotary embedding, the KV cache, grouped-query
attention, the Mixture-of-Experts feed-forward, the decoder blocks and the lm head.

Built on the meta device and filled by `load_state_dict(assign=True)` (see loading.py); the
only buffer it computes itself is RoPE's inverse frequencies (`Transformer.init_buffers`).
The matmul kernels it calls (oneDNN-blocked, native, int8, int4) live in projection.py,
native.py and quant.py; this module decides which one each weight uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from . import onednn
from .config import ModelConfig
from .native import NativeKernels, NativeProjection
from .projection import (
    BlockedProjection,
    DenseProjection,
    Int4Projection,
    Int8Projection,
    Projection,
    projection,
)
from .quant import Int4Experts, Int8Experts

__all__ = [
    "Attention",
    "AttentionStep",
    "BlockedExperts",
    "ExpertLoop",
    "GroupedExperts",
    "KVCache",
    "MoEFeedForward",
    "RMSNorm",
    "RopeTable",
    "Transformer",
    "apply_rope",
    "grouped_mm_supported",
    "inverse_frequencies",
    "rope_tables",
]


# ==============================================================================================
# Rotary position embedding
#
# Rotary position embedding, in the rotate-half layout Hugging Face Mixtral weights use.
# ==============================================================================================


def inverse_frequencies(head_dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    # Same expression as transformers' default RoPE, so the tables agree to the last bit.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim
    return 1.0 / (theta**exponents)  # [hd/2]


def rope_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin for `positions` [B, T]: each [B, T, 1, hd], broadcast over heads.

    The sin table carries rotate-half's sign (-sin on the first half), so that applying the
    rotation is one flip and one fused multiply-add (`apply_rope`).
    """
    freqs = positions[..., None].float() * inv_freq  # [B, T, hd/2], computed in fp32
    cos, sin = freqs.cos(), freqs.sin()
    return torch.cat((cos, cos), dim=-1).to(dtype).unsqueeze(2), torch.cat((-sin, sin), dim=-1).to(
        dtype
    ).unsqueeze(2)


class RopeTable:
    """`rope_tables` rows for positions 0..n-1, computed once and grown by doubling on demand.

    A decode step then gathers its rows (one op each) instead of recomputing them (about ten
    ops); the values are the same, computed by the same expression.
    """

    def __init__(self, inv_freq: torch.Tensor, dtype: torch.dtype) -> None:
        self.inv_freq, self.dtype = inv_freq, dtype
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None  # each [n, 1, hd]

    def lookup(
        self, positions: torch.Tensor, span: int, at: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin for `positions` [B, T], all < `span` (known on the host): each
        [B, T, 1, hd], or a [1, 1, hd] view when every position is `at`."""
        tables = self._tables
        if tables is None or tables[0].shape[0] < span:
            size = max(span, 2 * tables[0].shape[0] if tables is not None else 256)
            rows = torch.arange(size, device=self.inv_freq.device)[None]
            cos, sin = rope_tables(rows, self.inv_freq, self.dtype)  # [1, n, 1, hd]
            tables = self._tables = (cos[0], sin[0])
        if at is not None:  # a slice is a view, cheaper than a gather
            return tables[0][at : at + 1], tables[1][at : at + 1]
        return tables[0][positions], tables[1][positions]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, hd]: x*cos + rotate_half(x)*sin, rotate_half(x) = [-x2, x1]."""
    swapped = torch.roll(x, x.shape[-1] // 2, dims=-1)  # [x2, x1]
    return torch.addcmul(x * cos, swapped, signed_sin)


# ==============================================================================================
# The KV cache
#
# KVCache: keys and values pre-allocated for `max_batch` slots of `max_seq_len` positions.
#
# A slot is one running sequence. The serving runtime owns the slot bookkeeping (which slot is
# free, how far each has got); the cache is only the memory, written in place by `prefill` and
# `decode` and never reallocated, so a decode step allocates nothing proportional to the
# context.
# ==============================================================================================


@dataclass(frozen=True, slots=True, eq=False)
class KVCache:
    k: torch.Tensor  # [layers, max_batch, kv_heads, max_seq_len, head_dim]
    v: torch.Tensor  # same shape
    # per-layer views k[i], v[i], made once (saves two indexing ops per layer per step)
    layer_k: tuple[torch.Tensor, ...] = field(init=False)
    layer_v: tuple[torch.Tensor, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_k", tuple(self.k[i] for i in range(self.k.shape[0])))
        object.__setattr__(self, "layer_v", tuple(self.v[i] for i in range(self.v.shape[0])))

    @classmethod
    def allocate(
        cls,
        *,
        layers: int,
        max_batch: int,
        kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> KVCache:
        shape = (layers, max_batch, kv_heads, max_seq_len, head_dim)
        return cls(
            k=torch.zeros(shape, dtype=dtype, device=device),
            v=torch.zeros(shape, dtype=dtype, device=device),
        )

    @property
    def max_batch(self) -> int:
        return int(self.k.shape[1])

    @property
    def max_seq_len(self) -> int:
        return int(self.k.shape[3])

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


# ==============================================================================================
# Attention
#
# Grouped-query self-attention with a fused QKV projection and an optional KV cache.
#
# Three ways in (`AttentionStep`): a full causal forward over fresh tokens (no cache), a prefill
# that also writes its keys and values into cache rows starting at position 0, and a decode
# step (one token per row, each row at its own position) that writes one position per row and
# attends over the cache masked to that row's own length.
# ==============================================================================================


@dataclass(frozen=True, slots=True, eq=False)
class AttentionStep:
    """What one forward pass does with the cache; shared by every layer of that pass."""

    cache: KVCache | None = None
    rows: slice | None = None  # prefill: the cache rows written; decode: `slots` when contiguous
    slots: torch.Tensor | None = None  # decode: the cache row of each batch row [B]
    write_at: int | None = None  # decode: the one position all rows write, when known on the host
    positions: torch.Tensor | None = None  # decode: the position each row writes [B]
    kv_len: int = 0  # decode: cache positions attended (> every position)
    offset: int | None = None  # block prefill: the new tokens sit at offset.., on top of the cache
    mask: torch.Tensor | None = None  # additive [B, 1, T|1, L]; None: causal over the new tokens


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.wqkv: nn.Module = nn.Linear(dim, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.wo: nn.Module = nn.Linear(heads * head_dim, dim, bias=False)
        self.bound: tuple[Projection, Projection] | None = None  # (wqkv, wo), made by bind()

    def bind(self, kernels: NativeKernels | None = None) -> None:
        """Plain matmul objects for the hot path, once the weights are real (see projection.py);
        `kernels`: the native path's (paths.py)."""
        self.bound = (projection(self.wqkv, kernels=kernels), projection(self.wo, kernels=kernels))

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        step: AttentionStep,
        layer: int,
    ) -> torch.Tensor:
        """x [B, T, D] (normed), residual [B*T, D] -> residual + attention(x) [B*T, D]."""
        assert self.bound is not None, "bind() first"
        wqkv, wo = self.bound
        B, T, D = x.shape
        H, Hkv, hd = self.heads, self.kv_heads, self.head_dim
        qkv = wqkv(x.view(B * T, D)).view(B, T, H + 2 * Hkv, hd)
        qk = apply_rope(qkv[:, :, : H + Hkv], cos, sin)  # [B, T, H + Hkv, hd]: q and k at once
        v = qkv[:, :, H + Hkv :]  # [B, T, Hkv, hd]

        if step.positions is not None:
            return wo.add(residual, self._decode(qk, v, step, layer).view(B, H * hd))

        k = qk[:, :, H:].transpose(1, 2)  # [B, Hkv, T, hd]
        v = v.transpose(1, 2)
        if step.offset is not None:  # block prefill: attend over the cached prefix too
            return wo.add(
                residual, self._extend(qk, k, v, step, layer).transpose(1, 2).reshape(B * T, H * hd)
            )
        if step.cache is not None and step.rows is not None:
            step.cache.layer_k[layer][step.rows, :, :T] = k
            step.cache.layer_v[layer][step.rows, :, :T] = v
        y = F.scaled_dot_product_attention(
            qk[:, :, :H].transpose(1, 2),
            k,
            v,
            attn_mask=step.mask,
            is_causal=step.mask is None and T > 1,
            enable_gqa=self.kv_heads != self.heads,
        )  # [B, H, T, hd]
        return wo.add(residual, y.transpose(1, 2).reshape(B * T, H * hd))

    def _extend(
        self, qk: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: AttentionStep, layer: int
    ) -> torch.Tensor:
        """T new tokens at positions offset..offset+T-1 of rows `step.rows`: write their keys and
        values, attend over the rows' cache 0..offset+T-1 under `step.mask` -> [B, H, T, hd]."""
        assert step.cache is not None and step.rows is not None and step.offset is not None
        end = step.offset + k.shape[2]
        kc, vc = step.cache.layer_k[layer], step.cache.layer_v[layer]
        kc[step.rows, :, step.offset : end] = k
        vc[step.rows, :, step.offset : end] = v
        return F.scaled_dot_product_attention(
            qk[:, :, : self.heads].transpose(1, 2),
            kc[step.rows, :, :end],
            vc[step.rows, :, :end],
            attn_mask=step.mask,
            enable_gqa=self.kv_heads != self.heads,
        )  # [B, H, T, hd]

    def _decode(self, qk: torch.Tensor, v: torch.Tensor, step: AttentionStep, layer: int) -> torch.Tensor:
        """One new token per row: write its key and value, attend over the row's cache -> [B, Hkv, H/Hkv, hd]."""
        assert step.cache is not None
        assert step.positions is not None and step.slots is not None
        B, H, Hkv, hd = qk.shape[0], self.heads, self.kv_heads, self.head_dim
        kc, vc = step.cache.layer_k[layer], step.cache.layer_v[layer]  # [max_batch, Hkv, S, hd]
        k_new, v_new = qk[:, 0, H:], v[:, 0]  # [B, Hkv, hd]
        if step.write_at is not None and step.rows is not None:  # every row at one position
            kc[step.rows, :, step.write_at] = k_new
            vc[step.rows, :, step.write_at] = v_new
        else:
            kc[step.slots, :, step.positions] = k_new
            vc[step.slots, :, step.positions] = v_new
        if step.rows is not None:  # slots known to be contiguous: read views, no copy
            keys, values = kc[step.rows, :, : step.kv_len], vc[step.rows, :, : step.kv_len]
        else:  # arbitrary slots: gather only the attended prefix [B, Hkv, L, hd]
            keys = kc[:, :, : step.kv_len].index_select(0, step.slots)
            values = vc[:, :, : step.kv_len].index_select(0, step.slots)
        # One query per row: fold each kv head's query group into the query axis,
        # [B, H, hd] -> [B, Hkv, H/Hkv, hd]. On CPU this beats enable_gqa (no K/V repeat)
        # and the row mask [B, 1, 1, L] broadcasts over the group. SDPA stays: a manual
        # bmm-softmax-bmm measured 1.5-2.5x slower here at these sizes (B 1-8, L ~50).
        q = qk[:, 0, :H].view(B, Hkv, H // Hkv, hd)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=step.mask)  # [B, Hkv, H/Hkv, hd]


# ==============================================================================================
# The Mixture-of-Experts feed-forward
#
# Sparse Mixture-of-Experts feed-forward: a full-precision router and grouped expert matmuls.
#
# Routing is transformers' Mixtral router: softmax over all experts in fp32, top-k, then the k
# weights renormalised to sum to one (== a softmax over the top-k logits, two ops fewer).
#
# Dispatch has no Python loop over all experts. With N tokens:
#
# - N > 1 (prefill, batched decode): the (token, k) pairs are sorted by expert and the end
#   offset of each expert's group comes from the sorted ids. Then, by device and dtype:
#   - CPU fp32 (`BlockedExperts`): the experts' weights are reordered once into oneDNN's
#     blocked layout (onednn.py) and a host loop runs only the experts that got tokens, one
#     blocked product per projection (group ends read on the host: free on CPU).
#   - bf16, CUDA (`GroupedExperts`): one `torch._grouped_mm` per projection over the stacked
#     weights, no host sync.
#   - int8 and int4 (`Int8Experts`, `Int4Experts`): the same host loop as CPU fp32, one
#     quantized product per projection (quant.py says why).
#   Both host loops are one `ExpertLoop` over per-expert projections (projection.py).
# - N == 1 on CPU (batch-1 decode): a loop over the k chosen experts; the routing weight and
#   the residual are folded into the second projection.
#
# Why these paths (benchmarks/engine_moe_dispatch.py; the table is in docs/benchmarks.md):
# gathering copies each selected expert's weights once per (token, k) pair, which makes
# gpt-fast's gather-per-token dispatch far slower. On CPU `_grouped_mm` runs one MKL GEMM per
# expert and MKL reads the weight well below the memory's speed for the 1-16 rows an expert
# gets in decode; oneDNN's blocked kernel does not (onednn.py), so in fp32 the blocked loop is
# the CPU path. In bf16 and on CUDA `_grouped_mm` stays the path.
#
# `_grouped_mm`'s constraints, handled here: offsets are int32, rows must be 16-byte aligned
# (hidden and intermediate sizes times the element size divisible by 16), CPU takes fp32/bf16,
# CUDA bf16 on sm80+. Other cases use the gather path, which is correct but slow.
# ==============================================================================================


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
        self.bound: tuple[torch.Tensor, Batched, ExpertLoop, torch.Tensor] | None = None

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
        self.bound = (gate, batched, loop, torch.arange(self.num_experts, device=gate.device))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """x [N, D] (normed), residual [N, D] -> residual + MoE(x) [N, D]."""
        assert self.bound is not None, "bind() first"
        gate, batched, loop, expert_range = self.bound  # gate: full precision, also in int8 models
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


# ==============================================================================================
# The network
#
# The Mixtral network as plain modules: embeddings, decoder blocks, final norm, lm head.
#
# Built on the meta device and filled by `load_state_dict(assign=True)` (see loading.py); the
# only buffer it computes itself is RoPE's inverse frequencies (`init_buffers`).
# ==============================================================================================


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
        self.bound: Bound | None = None

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
        self.bound = Bound(
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
        assert self.rope is not None and self.bound is not None, "init_buffers() first"
        embeddings, layers, norm, head, eps = self.bound
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


class Bound(NamedTuple):
    """The weights the forward reads, as plain references (nn.Module attribute lookups and
    `__call__` cost ~1-1.5 us each here; a decode step of the small model is ~1 ms)."""

    embeddings: torch.Tensor  # [V, D]
    layers: tuple[tuple[torch.Tensor, Attention, torch.Tensor, MoEFeedForward], ...]
    norm: torch.Tensor  # [D]
    head: Projection
    eps: tuple[float, torch.Tensor]  # the norms' eps, and as a [1, 1, 1] fp32 tensor (rms_norm)
