"""MMD² permutation test on the exact kernel, computed once for the pooled windows.

With `K` the `[n, n]` kernel (zero diagonal) and `s` a 0/1 labelling of the reference
rows, the within- and between-group sums of a labelling are
`sxx = sᵀKs`, `sxy = sᵀK1 - sᵀKs`, `syy = 1ᵀK1 - 2 sᵀK1 + sᵀKs`,
so a block of permutations `S` costs one product `K @ S` and nothing per permutation.
"""

from __future__ import annotations

import numpy as np

from ._kernel import check_pair, kernel_from_gram, median_widths
from ._permutation import mmd2_from_sums, permutation_blocks, permutation_p_value
from ._stat import StatResult, TestOptions
from .errors import WindowTooSmall

__all__ = ["mmd_exact_test"]

METHOD = "mmd2_permutation_exact"


def mmd_exact_test(reference: np.ndarray, current: np.ndarray, options: TestOptions) -> StatResult:
    """Unbiased MMD² (averaged Gaussian kernel, widths from the reference) and its permutation p.

    Effect size (`score`) is the MMD² itself, in kernel units."""
    x, y = check_pair(reference, current)
    m, k = x.shape[0], y.shape[0]
    _require(m, k)
    widths = median_widths(x, options.bandwidth_multipliers, seed=options.seed)
    z = np.concatenate([x, y])
    kernel = kernel_from_gram(z @ z.T, widths)  # [n, n]
    np.fill_diagonal(kernel, 0.0)
    row_sums = kernel.sum(axis=1, dtype=np.float64)  # [n]
    total = float(row_sums.sum())
    parts = []
    for block in permutation_blocks(
        z.shape[0], m, options.permutations, seed=options.seed + 1, chunk=options.permutation_chunk
    ):  # [c, n]
        ks = kernel @ block.T  # [n, c]
        quad = np.einsum("ij,ji->i", block, ks, dtype=np.float64)  # sᵀKs  [c]
        lin = block.astype(np.float64) @ row_sums  # sᵀK1  [c]
        parts.append(mmd2_from_sums(quad, total - 2.0 * lin + quad, lin - quad, m, k))
    observed, p_value = permutation_p_value(np.concatenate(parts))
    return StatResult("mmd", METHOD, observed, observed, p_value, m, k, options.permutations)


def _require(m: int, k: int) -> None:
    if m < 2:
        raise WindowTooSmall("reference", m, 2)
    if k < 2:
        raise WindowTooSmall("current", k, 2)
