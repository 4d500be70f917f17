"""oneDNN-blocked fp32 weights: the CPU matmul for the few-row products of decode.

A weight [N, K] reordered once into oneDNN's blocked layout (`torch.ops.mkldnn`, the ops
inductor's weight freezing emits for fp32 linears on CPU) is then multiplied by any number of
rows. MKL's GEMM on the plain layout reads the weight well below the memory's speed for 1-8
rows; oneDNN's blocked kernel does not. benchmarks/engine_blocked_weights.py, torch 2.13, the
2-core test machine, 2 threads, 16 distinct weights alternated (streamed from memory), us per
call:

    [N, K] = [2048, 512]  rows      1     2     3     4     8
    MKL, x @ W.t() (stored)       412   611   695   541   586
    MKL, column-major copy        192   308   381   585   657
    oneDNN, blocked               187   173   131   132   177

    [N, K] = [512, 1024]  rows      1     2     3     4     8
    MKL, x @ W.t() (stored)       136   222   245   235   260
    oneDNN, blocked                52    67    55    56    85

The blocked tensor is opaque (no strides, no storage): it replaces the plain weight rather
than sitting beside it, so it costs no memory.
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
