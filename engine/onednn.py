"""oneDNN-blocked fp32 weights: the CPU matmul for the few-row products of decode.

A weight [N, K] reordered once into oneDNN's blocked layout (`torch.ops.mkldnn`, the ops
inductor's weight freezing emits for fp32 linears on CPU) is then multiplied by any number of
rows. MKL's GEMM on the plain layout reads the weight well below the memory's speed for 1-8
rows; oneDNN's blocked kernel does not (benchmarks/engine_blocked_weights.py; the figures
are in docs/benchmarks.md).

The blocked tensor is a copy, not a view: `block` reorders the weight into a new buffer, so
each blocked weight costs its full size in memory the process owns (twice that while the plain
weight is still referenced). The checkpoint's weights are memory-mapped, file-backed pages the
page cache can drop; the blocked copies are anonymous memory and cannot be.
"""

from __future__ import annotations

import torch

__all__ = ["HINT_ROWS", "available", "block", "linear", "linear_add"]

HINT_ROWS = 8  # the row count oneDNN picks its blocked layout for (any count runs on it)


def available(weight: torch.Tensor) -> bool:
    """Whether `weight` can be blocked: fp32 on a CPU with oneDNN in this torch build."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def block(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> the same values in oneDNN's blocked layout (an opaque tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), HINT_ROWS)


def linear(x: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
    """x [M, K] (contiguous) -> x W^T [M, N] for a weight `block` made."""
    return torch.ops.mkldnn._linear_pointwise(x, blocked, None, "none", [], "")


def linear_add(x: torch.Tensor, blocked: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual [M, N] + x W^T, the sum fused into the product as a oneDNN post-op."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, residual, blocked, None, "add")
