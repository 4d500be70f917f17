"""MMD² permutation test on random Fourier features: linear in the pooled size.

Each Gaussian width `w` gets `F` frequencies `ω ~ N(0, 2/w · I)`; the features
`[cos(Zω), sin(Zω)] / sqrt(B·F)` have `φ(x)·φ(y) ≈ k(x, y)` and `‖φ(x)‖² = 1` exactly.
The approximate kernel is fixed before the labels are looked at, so the permutation
p-value stays exact for it; only power can differ from the exact kernel's.
A block of permutations costs one product `S @ Φ`.
"""

from __future__ import annotations

import numpy as np

from ._kernel import check_pair, median_widths
from ._mmd_exact import _require
from ._permutation import mmd2_from_sums, permutation_blocks, permutation_p_value
from ._stat import StatResult, TestOptions

__all__ = ["fourier_features", "mmd_rff_test"]


def fourier_features(z: np.ndarray, widths: tuple[float, ...], frequencies: int, *, seed: int) -> np.ndarray:
    """`[n, 2·B·F]` float32 features whose dot products approximate the averaged kernel."""
    rng = np.random.default_rng(seed)
    dim = z.shape[1]
    omega = np.concatenate(
        [rng.standard_normal((dim, frequencies)) * np.sqrt(2.0 / w) for w in widths], axis=1
    ).astype(np.float32)  # [d, B·F]
    proj = z @ omega  # [n, B·F]
    scale = np.float32(1.0 / np.sqrt(len(widths) * frequencies))
    return np.concatenate([np.cos(proj), np.sin(proj)], axis=1) * scale


def mmd_rff_test(reference: np.ndarray, current: np.ndarray, options: TestOptions) -> StatResult:
    """As `mmd_exact_test`, on the random-feature kernel (score: its unbiased MMD²)."""
    x, y = check_pair(reference, current)
    m, k = x.shape[0], y.shape[0]
    _require(m, k)
    widths = median_widths(x, options.bandwidth_multipliers, seed=options.seed)
    phi = fourier_features(np.concatenate([x, y]), widths, options.rff_frequencies, seed=options.seed + 2)
    total = phi.sum(axis=0, dtype=np.float64)  # [D]
    parts = []
    for block in permutation_blocks(
        phi.shape[0], m, options.permutations, seed=options.seed + 1, chunk=options.permutation_chunk
    ):  # [c, n]
        tx = (block @ phi).astype(np.float64)  # Σ_ref φ  [c, D]
        ty = total - tx  # Σ_cur φ  [c, D]
        sxx = np.einsum("ij,ij->i", tx, tx) - m  # ‖φ‖² = 1 removes the diagonal
        syy = np.einsum("ij,ij->i", ty, ty) - k
        sxy = np.einsum("ij,ij->i", tx, ty)
        parts.append(mmd2_from_sums(sxx, syy, sxy, m, k))
    observed, p_value = permutation_p_value(np.concatenate(parts))
    method = f"mmd2_permutation_rff(features={phi.shape[1]})"
    return StatResult("mmd", method, observed, observed, p_value, m, k, options.permutations)
