"""Grouped-query self-attention with a fused QKV projection and an optional KV cache.

Three ways in (`AttentionStep`): a full causal forward over fresh tokens (no cache), a prefill
that also writes its keys and values into cache rows starting at position 0, and a decode
step (one token per row, each row at its own position) that writes one position per row and
attends over the cache masked to that row's own length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .cache import KVCache
from .native import NativeKernels
from .projection import Projection, projection
from .rope import apply_rope

__all__ = ["Attention", "AttentionStep"]


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
        self._bound: tuple[Projection, Projection] | None = None  # (wqkv, wo), made by bind()

    def bind(self, kernels: NativeKernels | None = None) -> None:
        """Plain matmul objects for the hot path, once the weights are real (see projection.py);
        `kernels`: the native path's (paths.py)."""
        self._bound = (projection(self.wqkv, kernels=kernels), projection(self.wo, kernels=kernels))

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
        assert self._bound is not None, "bind() first"
        wqkv, wo = self._bound
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
