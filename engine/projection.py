"""The linear layers of the hot path as plain objects: oneDNN-blocked (CPU fp32), dense, int8, int4.

`projection(module)` turns an `nn.Linear` or an `Int8Linear` into an object whose call is one
matmul op (no nn.Module `__call__`, no attribute lookups: about 3 us saved per use on the
2-core test machine, where a whole batch-1 decode step of the small benchmark model is
~1 ms), and whose `add` folds a residual in (`torch.addmm`, or oneDNN's add post-op), so
that the attention output projection and the residual sum are a single op. In fp32 on CPU
the attention projections run on a oneDNN-blocked copy of their weight (onednn.py says why).

`projection(module, head=True)` (the lm head): on CPU in fp32, a large head also gets a
oneDNN-blocked copy (`torch.ops.mkldnn`, the ops inductor's weight freezing emits for fp32
linears on CPU) used from 3 rows on; see `_blocked_head_wins`.
"""

from __future__ import annotations

import torch
from torch import nn

from . import onednn
from .native import NativeKernels, NativeProjection
from .quant import Int4Linear, Int8Linear, int4_matmul, int8_matmul

__all__ = [
    "BlockedProjection",
    "DenseProjection",
    "HeadProjection",
    "Int4Projection",
    "Int8Projection",
    "Projection",
    "projection",
]


class DenseProjection:
    __slots__ = ("wt",)

    def __init__(self, weight: torch.Tensor) -> None:
        self.wt = weight.t()  # [K, N] view; contiguous when the weight is stored column-major

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> x W^T [M, N]."""
        return torch.mm(x, self.wt)

    def add(self, residual: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        """residual [M, N] + alpha x W^T, one op."""
        return torch.addmm(residual, x, self.wt, alpha=alpha)


class BlockedProjection:
    """CPU fp32: a oneDNN-blocked copy of the weight (see onednn.py); `add` fuses the residual."""

    __slots__ = ("blocked",)

    def __init__(self, weight: torch.Tensor) -> None:
        self.blocked = onednn.block(weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return onednn.linear(x, self.blocked)

    def add(self, residual: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        if alpha == 1.0:  # the sum as a oneDNN post-op; it takes no scale
            return onednn.linear_add(x, self.blocked, residual)
        return torch.add(residual, onednn.linear(x, self.blocked), alpha=alpha)


class Int8Projection:
    __slots__ = ("scales", "weight")

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor) -> None:
        self.weight, self.scales = weight, scales  # int8 [N, K], [N]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return int8_matmul(x, self.weight, self.scales)

    def add(self, residual: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        return torch.add(residual, int8_matmul(x, self.weight, self.scales), alpha=alpha)


class Int4Projection:
    __slots__ = ("packed", "scales_zeros", "weight")

    def __init__(self, weight: torch.Tensor, scales_zeros: torch.Tensor, packed: bool) -> None:
        self.weight, self.scales_zeros, self.packed = weight, scales_zeros, packed  # quant.py: layout

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return int4_matmul(x, self.weight, self.scales_zeros, self.packed)

    def add(self, residual: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        return torch.add(residual, int4_matmul(x, self.weight, self.scales_zeros, self.packed), alpha=alpha)


class HeadProjection:
    """The CPU fp32 lm head: MKL on the column-major weight up to 2 rows, a oneDNN-blocked copy
    of it from 3 rows on (see `_blocked_head_wins` for why)."""

    __slots__ = ("blocked", "wt")

    def __init__(self, weight: torch.Tensor) -> None:
        self.wt = weight.t()  # [K, N]
        self.blocked = onednn.block(weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] < 3:
            return torch.mm(x, self.wt)
        return onednn.linear(x, self.blocked)

    def add(self, residual: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        return torch.add(residual, self(x), alpha=alpha)


Projection = (
    DenseProjection | BlockedProjection | Int8Projection | Int4Projection | HeadProjection | NativeProjection
)

BLOCKED_MIN_BYTES = 32 << 20  # smaller heads stay in cache; see _blocked_head_wins


def projection(module: nn.Module, *, head: bool = False, kernels: NativeKernels | None = None) -> Projection:
    """`kernels`: the native path (paths.py) for CPU fp32 projections, the head included (its
    packed copy streams as fast as the oneDNN-blocked one and beats MKL at every row count:
    docs/benchmarks.md, issue 13 part 2)."""
    if isinstance(module, Int8Linear):
        return Int8Projection(module.weight, module.scales)
    if isinstance(module, Int4Linear):
        return Int4Projection(module.weight, module.scales_zeros, module.packed)
    assert isinstance(module, nn.Linear) and module.bias is None
    if kernels is not None and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu":
        return NativeProjection(module.weight, kernels)
    if head:
        return (
            HeadProjection(module.weight)
            if _blocked_head_wins(module.weight)
            else DenseProjection(module.weight)
        )
    return (
        BlockedProjection(module.weight)
        if onednn.available(module.weight)
        else DenseProjection(module.weight)
    )


def _blocked_head_wins(weight: torch.Tensor) -> bool:
    """Whether an lm head weight [V, D] gets the oneDNN-blocked copy for batches of 3+ rows.

    MKL's GEMM from 2 to ~16 rows reads the weight far below the memory's speed, oneDNN's
    blocked layout does not; but oneDNN loses at one row and adds a fixed cost per call, so it
    is used from 3 rows on and only for heads too large to stay in cache (BLOCKED_MIN_BYTES).
    The per-row timings and the decode tokens/s it was chosen by are in docs/benchmarks.md
    (issue 12's section). Cost: a second copy of large heads.
    """
    return onednn.available(weight) and weight.numel() * weight.element_size() >= BLOCKED_MIN_BYTES
