"""GPTQ for the engine's int4 layout: Frantar et al.'s layer-wise quantization of one weight.

For a linear y = x W^T whose inputs over a calibration set are X [n, K], the loss of a
quantized Q is ||X W^T - X Q^T||^2 = tr((W - Q) H (W - Q)^T) / 2 with H = 2 X^T X [K, K]. GPTQ
quantizes the columns of W one at a time, in order, and after each one spreads its rounding
error over the columns not yet quantized, weighted by the inverse Hessian's row: the optimal
correction for that loss (Optimal Brain Surgeon with the remaining columns free). Done
directly that is O(K^3) per column; the paper's reformulation takes the upper Cholesky factor
of H^-1 once, and applies the corrections in blocks of columns (lazy batch updates), so the
whole weight costs about what one Cholesky does.

The grid is the engine's own int4 (quant.py's `int4_groups`): per row and run of G columns,
q in 0..15 and w ~ lo + q * scale (= (q - 8) * scale + zero, zero = lo + 8 * scale), scale =
(max - min) / 15 of the group's weights at the moment its first column comes up (so earlier
corrections are inside the grid), with the scale and zero rounded to bf16 first: that is what
the engine serves on CPU, and the error fed forward is then the error it will really make.

Activation order (`act_order`): the columns are visited by decreasing H diagonal (the inputs
that matter most go first, while the most columns are left to absorb their error); the groups
stay runs of G consecutive columns of the original order, their grids fixed from the weight
before any correction ("static groups"), so the stored layout is unchanged.

Dampening: H + percdamp * mean(diag H) * I keeps the Cholesky factor defined when inputs are
correlated or some are never non-zero (a column with H_kk = 0 is dead: its weight is set to
0 before quantizing, it cannot change the output on this data).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Hessian", "Int4Rows", "gptq_int4", "output_error", "rtn_int4"]


@dataclass(frozen=True, slots=True)
class Int4Rows:
    """A weight [N, K] on the engine's int4 grid: q uint8 [N, K] in 0..15, scales and lows
    [N, K/G] fp32 (already bf16-representable): w ~ lows + q * scales, per group."""

    q: torch.Tensor
    scales: torch.Tensor
    lows: torch.Tensor

    @property
    def group(self) -> int:
        return self.q.shape[1] // self.scales.shape[1]

    def dequantize(self) -> torch.Tensor:
        g = self.group
        return (
            self.lows.repeat_interleave(g, 1) + self.q.float() * self.scales.repeat_interleave(g, 1)
        ).float()

    def layout(self) -> dict[str, torch.Tensor]:
        """The tensors quant.py's `int4_groups(..., packed=False)` makes: plain nibbles (low
        nibble first) uint8 [N, K/2] and scales_zeros fp32 [K/G, N, 2]."""
        q = self.q
        zeros = self.lows + 8.0 * self.scales
        return {
            "weight": (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous(),
            "scales_zeros": torch.stack([self.scales, zeros], dim=-1).transpose(0, 1).contiguous(),
        }


class Hessian:
    """H = 2 X^T X / n of one linear's inputs, accumulated batch by batch in fp64 (the sum of
    many outer products loses the small eigenvalues GPTQ's corrections rely on in fp32)."""

    __slots__ = ("count", "sum")

    def __init__(self, k: int) -> None:
        self.sum = torch.zeros(k, k, dtype=torch.float64)
        self.count = 0

    def add(self, x: torch.Tensor) -> None:
        """x [n, K]: n more input rows."""
        if x.shape[0]:
            x64 = x.reshape(-1, x.shape[-1]).to(torch.float64)
            self.sum.addmm_(x64.t(), x64)
            self.count += x64.shape[0]

    def value(self) -> torch.Tensor:
        return (2.0 * self.sum / max(self.count, 1)).float()


def _grid(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, G] -> (scale, low) [N] of its min-max int4 grid, both rounded to bf16."""
    lo, hi = w.amin(dim=1), w.amax(dim=1)
    scale = ((hi - lo) / 15.0).clamp_min(torch.finfo(torch.float32).tiny).to(torch.bfloat16).float()
    zero = (lo + 8.0 * scale).to(torch.bfloat16).float()  # the engine stores zero, not low
    return scale, zero - 8.0 * scale


def rtn_int4(w: torch.Tensor, group: int) -> Int4Rows:
    """Round to nearest on the same grid (what `load(quantize="int4")` does)."""
    n, k = w.shape
    groups = w.float().reshape(n, k // group, group)
    scales, lows = _grid(groups.reshape(-1, group))
    scales, lows = scales.view(n, -1), lows.view(n, -1)
    q = torch.round((groups - lows[..., None]) / scales[..., None]).clamp_(0, 15).to(torch.uint8)
    return Int4Rows(q.reshape(n, k), scales, lows)


def gptq_int4(
    w: torch.Tensor,
    hessian: torch.Tensor,
    group: int,
    *,
    percdamp: float = 0.01,
    act_order: bool = False,
    blocksize: int = 128,
) -> Int4Rows:
    """w [N, K] and its inputs' H [K, K] -> the int4 weight GPTQ chooses (module docstring)."""
    n, k = w.shape
    if k % group:
        raise ValueError(f"group size {group} does not divide the row length {k}")
    W = w.float().clone()
    H = hessian.float().clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    ngroups = k // group
    scales = torch.empty(n, ngroups)
    lows = torch.empty(n, ngroups)
    perm = torch.arange(k)
    if act_order:  # static groups: every grid from the uncorrected weight, in the stored order
        for g in range(ngroups):
            scales[:, g], lows[:, g] = _grid(W[:, g * group : (g + 1) * group])
        perm = torch.argsort(torch.diag(H), descending=True)
        W, H = W[:, perm], H[perm][:, perm]
    H += percdamp * torch.mean(torch.diag(H)) * torch.eye(k)
    L = torch.linalg.cholesky(H)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True)  # upper factor of H^-1
    Q = torch.zeros(n, k, dtype=torch.uint8)
    blocksize = max(group, blocksize // group * group)  # a group never straddles two blocks
    for i1 in range(0, k, blocksize):
        i2 = min(i1 + blocksize, k)
        W1, Hinv1 = W[:, i1:i2].clone(), Hinv[i1:i2, i1:i2]
        Err1 = torch.zeros_like(W1)
        for i in range(i2 - i1):
            col = int(perm[i1 + i])
            g = col // group
            if not act_order and col % group == 0:  # the group's grid, its earlier corrections in
                scales[:, g], lows[:, g] = _grid(W1[:, i : i + group])
            x = W1[:, i]
            q = torch.round((x - lows[:, g]) / scales[:, g]).clamp_(0, 15)
            Q[:, col] = q.to(torch.uint8)
            err = (x - (lows[:, g] + q * scales[:, g])) / Hinv1[i, i]
            W1[:, i:] -= err[:, None] * Hinv1[i, i:][None, :]
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
    return Int4Rows(Q, scales, lows)


def output_error(w: torch.Tensor, quantized: torch.Tensor, hessian: torch.Tensor) -> float:
    """tr((W - Q) H (W - Q)^T): the summed squared output error on the calibration inputs, up
    to GPTQ's constant; what it minimises, and what the tests compare RTN and GPTQ by."""
    d = (w.float() - quantized.float()).double()
    return float(torch.einsum("nk,kl,nl->", d, hessian.double(), d))
