"""Rotary position embedding, in the rotate-half layout Hugging Face Mixtral weights use."""

from __future__ import annotations

import torch

__all__ = ["apply_rope", "inverse_frequencies", "rope_tables"]


def inverse_frequencies(head_dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    # Same expression as transformers' default RoPE, so the tables agree to the last bit.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim
    return 1.0 / (theta**exponents)  # [hd/2]


def rope_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin for `positions` [B, T]: each [B, 1, T, hd], broadcast over heads."""
    freqs = positions[..., None].float() * inv_freq  # [B, T, hd/2], computed in fp32
    emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, hd]
    return emb.cos().to(dtype).unsqueeze(1), emb.sin().to(dtype).unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, hd] rotated by the tables of `rope_tables`."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
