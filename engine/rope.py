"""Rotary position embedding, in the rotate-half layout Hugging Face Mixtral weights use."""

from __future__ import annotations

import torch

__all__ = ["RopeTable", "apply_rope", "inverse_frequencies", "rope_tables"]


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
