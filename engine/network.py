"""The Mixtral network, top to bottom: rotary embedding, the KV cache, grouped-query
attention, the Mixture-of-Experts feed-forward, the decoder blocks and the lm head.

Plain objects, built once at load by `build` from the engine's state dict (checkpoint.py's
`build_state`): each holds its tensors and projections (projection.py) and the forward reads
them directly; there is no nn.Module tree. The only tensors computed here are RoPE's tables.
The matmul kernels it calls (oneDNN-blocked, native, int8, int4) live in projection.py,
native.py and quant.py; `build` decides which one each weight uses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import projection as projections
from .config import ModelConfig
from .native import NativeKernels
from .projection import DenseProjection, Projection, head_projection, projection
from .quant import WeightFormat

__all__ = [
    "Attention",
    "AttentionStep",
    "ExpertLoop",
    "GroupedExperts",
    "KVCache",
    "Layer",
    "MoEFeedForward",
    "RopeTable",
    "Transformer",
    "apply_rope",
    "build",
    "grouped_mm_supported",
    "inverse_frequencies",
    "rope_tables",
    "state_shapes",
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


class Attention:
    """One layer's attention: the fused QKV and output projections, and the head counts."""

    __slots__ = ("head_dim", "heads", "kv_heads", "wo", "wqkv")

    def __init__(self, wqkv: Projection, wo: Projection, heads: int, kv_heads: int, head_dim: int) -> None:
        self.wqkv, self.wo = wqkv, wo
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim

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
        wqkv, wo = self.wqkv, self.wo
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
        # bmm-softmax-bmm measured slower at these sizes (B 1-8, L ~50).
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
#   - CPU fp32 (an `ExpertLoop` as `batched`): the experts' weights are reordered once into oneDNN's
#     blocked layout (projection.py's oneDNN functions) and a host loop runs only the experts that got tokens, one
#     blocked product per projection (group ends read on the host: free on CPU).
#   - bf16, CUDA (`GroupedExperts`): one `torch._grouped_mm` per projection over the stacked
#     weights, no host sync.
#   - int8 and int4 (an `ExpertLoop` too): the same host loop as CPU fp32, one
#     quantized product per projection (quant.py says why).
#   Both host loops are one `ExpertLoop` over per-expert projections (projection.py).
# - N == 1 on CPU (batch-1 decode): a loop over the k chosen experts; the routing weight and
#   the residual are folded into the second projection.
#
# Why these paths (benchmarks/engine_moe_dispatch.py; the table is in docs/benchmarks/engine.md):
# gathering copies each selected expert's weights once per (token, k) pair, which makes
# gpt-fast's gather-per-token dispatch far slower. On CPU `_grouped_mm` runs one MKL GEMM per
# expert and MKL reads the weight well below the memory's speed for the 1-16 rows an expert
# gets in decode; oneDNN's blocked kernel does not (projection.py's oneDNN functions), so in fp32 the blocked loop is
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


class GroupedExperts:
    """E SwiGLU experts as two stacked weights: w13 [E, 2I, D] (w1 rows, then w3) and w2 [E, D, I]."""

    __slots__ = ("grouped", "w2", "w13")

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, *, grouped: bool) -> None:
        self.w13, self.w2, self.grouped = w13, w2, grouped

    def __call__(self, xs: torch.Tensor, expert_ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """xs [S, D] sorted by expert, expert_ids [S] sorted, offsets [E] int32 group ends -> [S, D]."""
        if self.grouped:
            h = torch._grouped_mm(xs, self.w13.transpose(-2, -1), offs=offsets)  # [S, 2I]
            gate, up = h.chunk(2, dim=-1)
            return torch._grouped_mm(F.silu(gate) * up, self.w2.transpose(-2, -1), offs=offsets)
        h = torch.einsum("sd,sod->so", xs, self.w13[expert_ids])  # gather fallback, odd sizes
        gate, up = h.chunk(2, dim=-1)
        return torch.einsum("si,sdi->sd", F.silu(gate) * up, self.w2[expert_ids])


class MoEFeedForward:
    """One layer's MoE: the router weight (always full precision), the batched experts
    (`GroupedExperts`, or the `ExpertLoop` itself) and the per-expert loop (`ExpertLoop`)."""

    __slots__ = ("batched", "expert_range", "gate", "loop", "top_k")

    def __init__(self, gate: torch.Tensor, batched: Batched, loop: ExpertLoop, top_k: int) -> None:
        self.gate, self.batched, self.loop, self.top_k = gate, batched, loop, top_k
        self.expert_range = torch.arange(gate.shape[0], device=gate.device)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """x [N, D] (normed), residual [N, D] -> residual + MoE(x) [N, D]."""
        gate, loop = self.gate, self.loop
        logits = F.linear(x if x.dtype == gate.dtype else x.to(gate.dtype), gate)  # [N, E]
        top, chosen = torch.topk(logits, self.top_k, dim=-1)  # [N, k]
        weights = torch.softmax(top, dim=-1, dtype=torch.float32)
        if x.shape[0] == 1 and x.device.type == "cpu":  # see the section's comment
            out = residual
            for e, w in zip(chosen[0].tolist(), weights[0].tolist(), strict=True):
                out = loop.add_one(x, e, w, out)
            return out

        expert_ids, order = torch.sort(chosen.view(-1), stable=True)  # [S = N k]
        offsets = torch.searchsorted(expert_ids, self.expert_range, right=True, out_int32=True)
        token = order // self.top_k  # the token of each sorted (token, k) pair
        ys = self.batched(x[token], expert_ids, offsets)  # [S, D], sorted by expert
        ys = ys * weights.view(-1, 1)[order]  # fp32: weighted sums in fp32, as transformers
        if ys.dtype == residual.dtype:
            return residual.index_add(0, token, ys)
        out = torch.zeros((x.shape[0], x.shape[1]), dtype=ys.dtype, device=x.device).index_add_(0, token, ys)
        return residual + out.to(residual.dtype)


# ==============================================================================================
# The network
#
# The Mixtral network as plain objects: embeddings, decoder layers, final norm, lm head, each
# a tensor or a projection read straight by the forward (an nn.Module attribute lookup or
# `__call__` costs about a microsecond each, against a decode step of about a millisecond
# for the small benchmark model).
# ==============================================================================================


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, eps_t: torch.Tensor) -> torch.Tensor:
    """x [..., D] / sqrt(mean(x^2) + eps) * weight; `eps_t` is eps as a [1, 1, 1] fp32 tensor."""
    if x.dtype != torch.float32:  # one fused op; normalises in fp32 internally, like transformers' upcast
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    # fp32: eps + sum(x^2)/D as one batched dot product, then rsqrt and two multiplies in
    # place: fewer kernels than F.rms_norm runs on CPU (about eight)
    rows = x.reshape(-1, 1, x.shape[-1])  # [N, 1, D]
    mean_sq = torch.baddbmm(eps_t, rows, rows.transpose(1, 2), alpha=1.0 / x.shape[-1])
    return torch.mul(rows, mean_sq.rsqrt_()).mul_(weight).view(x.shape)


class Layer(NamedTuple):
    """One decoder layer: a tuple, so that the forward unpacks it in one step."""

    attention_norm: torch.Tensor  # [D]
    attention: Attention
    ffn_norm: torch.Tensor  # [D]
    moe: MoEFeedForward


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Transformer:
    """The network `build` makes: every weight the forward reads, nothing else."""

    config: ModelConfig
    embeddings: torch.Tensor  # [V, D]
    layers: tuple[Layer, ...]
    norm: torch.Tensor  # [D]
    head: Projection  # the lm head (projection.py's `head_projection`: one strategy per device)
    rope: RopeTable
    eps: tuple[float, torch.Tensor]  # the norms' eps, and as a [1, 1, 1] fp32 tensor (rms_norm)

    def __call__(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        step: AttentionStep,
        *,
        span: int,
        last_only: bool,
    ) -> torch.Tensor:
        """tokens, positions [B, T] (every position < span) -> fp32 logits [B, T, V] ([B, V] if last_only)."""
        eps = self.eps
        B, T = tokens.shape
        x = F.embedding(tokens, self.embeddings)  # [B, T, D]
        cos, sin = self.rope.lookup(positions, span, step.write_at)
        for i, (attention_norm, attention, ffn_norm, moe) in enumerate(self.layers):
            h = attention.forward(rms_norm(x, attention_norm, *eps), x.view(B * T, -1), cos, sin, step, i)
            x = moe.forward(rms_norm(h, ffn_norm, *eps), h).view(B, T, -1)  # [B, T, D]
        if last_only:
            x = x[:, -1]  # [B, D]
        logits = self.head(rms_norm(x, self.norm, *eps).reshape(-1, x.shape[-1]))
        return logits.float().view(*x.shape[:-1], -1)

    def projections(self) -> Iterator[Projection]:
        """Every projection the forward runs: each layer's attention and experts, then the head."""
        for layer in self.layers:
            yield layer.attention.wqkv
            yield layer.attention.wo
            for pair in layer.moe.loop.pairs:
                yield from pair
        yield self.head


def build(
    config: ModelConfig,
    state: Mapping[str, torch.Tensor],
    *,
    kernels: NativeKernels | None = None,
    fmt: WeightFormat | None = None,
) -> Transformer:
    """The network from the engine's state dict (checkpoint.py's `build_state` names: e.g.
    `layers.0.attention.wqkv.weight`, and `.scales` or `.scales_zeros` beside it when
    quantized as `fmt`). `kernels`: the native path's (paths.py), whose packed copies then
    replace CPU fp32 weights. Every projection is made here, once."""
    c, embeddings = config, state["tok_embeddings.weight"]
    device = embeddings.device

    def parts(name: str) -> dict[str, torch.Tensor]:
        return {k[len(name) + 1 :]: v for k, v in state.items() if k.startswith(name + ".")}

    layers = []
    for n in range(c.num_hidden_layers):
        m = f"layers.{n}."
        attention = Attention(
            projection(parts(m + "attention.wqkv"), kernels=kernels, fmt=fmt),
            projection(parts(m + "attention.wo"), kernels=kernels, fmt=fmt),
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        )
        moe = _moe(parts(m + "moe.experts"), state[m + "moe.gate.weight"], c, kernels, fmt)
        layers.append(Layer(state[m + "attention_norm.weight"], attention, state[m + "ffn_norm.weight"], moe))
    eps = c.rms_norm_eps
    return Transformer(
        config=c,
        embeddings=embeddings,
        layers=tuple(layers),
        norm=state["norm.weight"],
        head=head_projection(parts("output"), kernels=kernels, fmt=fmt),
        rope=RopeTable(inverse_frequencies(c.head_dim, c.rope_theta, device), embeddings.dtype),
        eps=(eps, torch.full((1, 1, 1), eps, device=device)),
    )


def state_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The full-precision state dict `build` reads, name -> shape (as checkpoint.py's
    `build_state` makes it; quantized weights replace `x.weight` by `x.weight` and `x.scales`
    or `x.scales_zeros`, and `moe.experts.w13` by `w13_weight` and `w13_scales`...)."""
    D, inter, E, hd = c.hidden_size, c.intermediate_size, c.num_local_experts, c.head_dim
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * hd
    shapes: dict[str, tuple[int, ...]] = {
        "tok_embeddings.weight": (c.vocab_size, D),
        "norm.weight": (D,),
        "output.weight": (c.vocab_size, D),
    }
    for n in range(c.num_hidden_layers):
        m = f"layers.{n}."
        shapes |= {
            m + "attention.wqkv.weight": (qkv, D),
            m + "attention.wo.weight": (D, c.num_attention_heads * hd),
            m + "attention_norm.weight": (D,),
            m + "ffn_norm.weight": (D,),
            m + "moe.gate.weight": (E, D),
            m + "moe.experts.w13": (E, 2 * inter, D),
            m + "moe.experts.w2": (E, D, inter),
        }
    return shapes


def _moe(
    experts: dict[str, torch.Tensor],
    gate: torch.Tensor,
    c: ModelConfig,
    kernels: NativeKernels | None,
    fmt: WeightFormat | None,
) -> MoEFeedForward:
    """One layer's MoE from its stacked experts: `w13` and `w2` (full precision), or each as
    `_weight` with `_scales` / `_scales_zeros` (quantized). CPU fp32 with oneDNN (or on the
    native path) runs an `ExpertLoop` of blocked (packed) copies, and the stacks are dropped;
    quantized experts an `ExpertLoop` of views; the rest `GroupedExperts` on the stacks."""
    E, D, k = c.num_local_experts, c.hidden_size, c.num_experts_per_tok
    if "w13" not in experts:  # quantized: per-expert views of the stacked tensors
        scales = "scales" if "w13_scales" in experts else "scales_zeros"

        def one(w: str, e: int) -> Projection:
            parts = {"weight": experts[f"{w}_weight"][e], scales: experts[f"{w}_{scales}"][e]}
            if f"{w}_scales_mins" in experts:  # a stored int4 build's exact scales and mins
                parts["scales_mins"] = experts[f"{w}_scales_mins"][e]
            return projection(parts, fmt=fmt)

        loop = ExpertLoop(tuple((one("w13", e), one("w2", e)) for e in range(E)), D)
        return MoEFeedForward(gate, loop, loop, k)
    w13, w2 = experts["w13"], experts["w2"]
    if (kernels is not None and w13.dtype == torch.float32) or projections.blockable(w13):
        blocked = tuple(
            (projection({"weight": w13[e]}, kernels=kernels), projection({"weight": w2[e]}, kernels=kernels))
            for e in range(E)
        )
        loop = ExpertLoop(blocked, D)
        return MoEFeedForward(gate, loop, loop, k)  # the copies replace the stacks, which are dropped
    loop = ExpertLoop(tuple((DenseProjection(w13[e]), DenseProjection(w2[e])) for e in range(E)), D)
    grouped = grouped_mm_supported(D, c.intermediate_size, w13.dtype, w13.device)
    if not grouped and w13.device.type == "cpu":
        # fp16 (no CPU _grouped_mm) and odd sizes: the gather fallback would copy each token's
        # experts' weights ([tokens, 2I, D] a layer); the host loop reads each active one once
        return MoEFeedForward(gate, loop, loop, k)
    return MoEFeedForward(gate, GroupedExperts(w13, w2, grouped=grouped), loop, k)
