"""The linear layers of the hot path as plain objects: oneDNN-blocked (CPU fp32), dense, int8, int4.

`projection(parts)` turns a weight as loaded (`{"weight": ...}`, with `"scales"` for int8 or
`"scales_zeros"` for int4) into an object whose call is one matmul op, and whose `add` folds
a residual in (`torch.addmm`, or oneDNN's add post-op), so that the attention output
projection and the residual sum are a single op. In fp32 on CPU the projections run on a
oneDNN-blocked copy of their weight (see "oneDNN-blocked weights" below), or on the native kernels' packed
copy when the model runs the native path (native.py).

`head_projection(parts)`: the lm head, one strategy per device (see its docstring).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .native import NativeKernels, NativeProjection
from .quant import WeightFormat, fp8_matmul, int4_matmul, int8_matmul

__all__ = [
    "HINT_ROWS",
    "BlockedProjection",
    "DenseProjection",
    "Fp8Projection",
    "HeadProjection",
    "Int4Projection",
    "Int8Projection",
    "Projection",
    "block",
    "blockable",
    "blocked_linear",
    "blocked_linear_add",
    "head_projection",
    "projection",
]


# -- oneDNN-blocked weights ------------------------------------------------------------
# oneDNN-blocked fp32 weights: the CPU matmul for the few-row products of decode.
#
# A weight [N, K] reordered once into oneDNN's blocked layout (`torch.ops.mkldnn`, the ops
# inductor's weight freezing emits for fp32 linears on CPU) is then multiplied by any number of
# rows. MKL's GEMM on the plain layout reads the weight well below the memory's speed for 1-8
# rows; oneDNN's blocked kernel does not (benchmarks/engine_blocked_weights.py; the figures
# are in docs/benchmarks/engine.md).
#
# The blocked tensor is a copy, not a view: `block` reorders the weight into a new buffer, so
# each blocked weight costs its full size in memory the process owns (twice that while the plain
# weight is still referenced). The checkpoint's weights are memory-mapped, file-backed pages the
# page cache can drop; the blocked copies are anonymous memory and cannot be.

HINT_ROWS = 8  # the row count oneDNN picks its blocked layout for (any count runs on it)


def blockable(weight: torch.Tensor) -> bool:
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


def blocked_linear(x: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
    """x [M, K] (contiguous) -> x W^T [M, N] for a weight `block` made."""
    return torch.ops.mkldnn._linear_pointwise(x, blocked, None, "none", [], "")


def blocked_linear_add(x: torch.Tensor, blocked: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual [M, N] + x W^T, the sum fused into the product as a oneDNN post-op."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, residual, blocked, None, "add")


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
    """CPU fp32: a oneDNN-blocked copy of the weight (see the oneDNN functions below); `add` fuses the residual."""

    __slots__ = ("blocked",)

    def __init__(self, weight: torch.Tensor) -> None:
        self.blocked = block(weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return blocked_linear(x, self.blocked)

    def add(self, residual: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        if alpha == 1.0:  # the sum as a oneDNN post-op; it takes no scale
            return blocked_linear_add(x, self.blocked, residual)
        return torch.add(residual, blocked_linear(x, self.blocked), alpha=alpha)


class Int8Projection:
    __slots__ = ("scales", "weight")

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor) -> None:
        self.weight, self.scales = weight, scales  # int8 [N, K], [N]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return int8_matmul(x, self.weight, self.scales)

    def add(self, residual: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        return torch.add(residual, int8_matmul(x, self.weight, self.scales), alpha=alpha)


class Fp8Projection:
    __slots__ = ("scales", "weight")

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor) -> None:
        self.weight, self.scales = weight, scales  # float8_e4m3fn [N, K], [N]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_matmul(x, self.weight, self.scales)

    def add(self, residual: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        return torch.add(residual, fp8_matmul(x, self.weight, self.scales), alpha=alpha)


class Int4Projection:
    """int4 group-wise (quant.py's layout). `exact`: where a build carries its groups' scales
    and mins at more precision than `scales_zeros` holds in the activation dtype (a stored
    build, quantized_store.py), fp16 [K/G, N, 2] of (scale, min): what the native step packs."""

    __slots__ = ("exact", "packed", "scales_zeros", "weight")

    def __init__(
        self,
        weight: torch.Tensor,
        scales_zeros: torch.Tensor,
        packed: bool,
        exact: torch.Tensor | None = None,
    ) -> None:
        self.weight, self.scales_zeros, self.packed = weight, scales_zeros, packed  # quant.py: layout
        self.exact = exact

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return int4_matmul(x, self.weight, self.scales_zeros, self.packed)

    def add(self, residual: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        return torch.add(residual, int4_matmul(x, self.weight, self.scales_zeros, self.packed), alpha=alpha)


class HeadProjection:
    """The CPU lm head on the eager path: MKL on a column-major copy of the weight for one
    row, a oneDNN-blocked copy of it from 2 rows on when oneDNN takes the weight (fp32). See
    `head_projection` for why."""

    __slots__ = ("blocked", "wt")

    def __init__(self, weight: torch.Tensor) -> None:
        self.wt = weight.t().contiguous()  # [K, N]: the weight column-major, one copy
        self.blocked = block(weight) if blockable(weight) else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocked is None or x.shape[0] == 1:
            return torch.mm(x, self.wt)
        return blocked_linear(x, self.blocked)

    def add(self, residual: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        return torch.add(residual, self(x), alpha=alpha)


Projection = (
    DenseProjection
    | BlockedProjection
    | Int8Projection
    | Fp8Projection
    | Int4Projection
    | HeadProjection
    | NativeProjection
)


def projection(
    parts: Mapping[str, torch.Tensor],
    *,
    kernels: NativeKernels | None = None,
    fmt: WeightFormat | None = None,
) -> Projection:
    """A projection from its loaded tensors: `weight` [N, K], with `scales` (int8) or
    `scales_zeros` (int4, stored as `fmt` says). Full-precision CPU fp32 weights run on the
    native kernels' packed copy when `kernels` is given (the native path, paths.py), else
    on a oneDNN-blocked copy; other weights (bf16, CUDA, no oneDNN) as stored."""
    weight = parts["weight"]
    if "scales" in parts and weight.dtype == torch.float8_e4m3fn:
        return Fp8Projection(weight, parts["scales"])
    if "scales" in parts:
        return Int8Projection(weight, parts["scales"])
    if "scales_zeros" in parts:
        assert fmt is not None
        return Int4Projection(
            weight, parts["scales_zeros"], fmt.packs(weight.shape[0]), parts.get("scales_mins")
        )
    if kernels is not None and weight.dtype == torch.float32 and weight.device.type == "cpu":
        return NativeProjection(weight, kernels)
    return BlockedProjection(weight) if blockable(weight) else DenseProjection(weight)


def head_projection(
    parts: Mapping[str, torch.Tensor],
    *,
    kernels: NativeKernels | None = None,
    fmt: WeightFormat | None = None,
) -> Projection:
    """The lm head: one strategy per device and path, whatever the head's size.

    - quantized: the quantized kernel, as every other projection;
    - CPU fp32 on the native path: the native kernels' packed copy, which streams as fast as
      the oneDNN-blocked one and beats MKL at every row count;
    - CPU on the eager path: `HeadProjection`. At one row (batch-1 decode) MKL on a
      column-major copy of the weight is the fastest kernel (MKL on the stored row-major
      weight is slower at every decode row count); from 2 rows on oneDNN's blocked copy
      reads the weight far faster than either MKL layout, but at one row it loses to MKL,
      so neither kernel alone is fastest at both batch 1 and batch 8;
    - other devices (CUDA): the stored weight as it is.

    The per-row timings these were chosen by are in docs/benchmarks/engine.md
    (benchmarks/engine_head_layout.py). Cost on CPU: the copies, one or two of the head.
    """
    weight = parts["weight"]
    if len(parts) > 1 or (kernels is not None and weight.dtype == torch.float32):
        return projection(parts, kernels=kernels, fmt=fmt)
    return HeadProjection(weight) if weight.device.type == "cpu" else DenseProjection(weight)
