"""Permutations as indicator matrices, so a whole block of them is one matrix product.

Row 0 of the first block is the observed split (the first `m` pooled rows are the
reference); every other row is a uniformly random relabelling. The p-value counts the
observed statistic among the permuted ones: `(b + 1) / (P + 1)`, valid at any P.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["mmd2_from_sums", "permutation_blocks", "permutation_p_value"]


def permutation_blocks(n: int, m: int, permutations: int, *, seed: int, chunk: int) -> Iterator[np.ndarray]:
    """Blocks of `[c, n]` float32 0/1 rows marking the `m` rows labelled "reference":
    the observed labelling first, then `permutations` random ones, at most `chunk` rows a block."""
    rng = np.random.default_rng(seed)
    observed = np.zeros(n, dtype=np.float32)
    observed[:m] = 1.0
    remaining = permutations + 1
    first = True
    while remaining > 0:
        c = min(chunk, remaining)
        block = rng.permuted(np.broadcast_to(observed, (c, n)).copy(), axis=1)
        if first:
            block[0] = observed
            first = False
        remaining -= c
        yield block


def mmd2_from_sums(sxx: np.ndarray, syy: np.ndarray, sxy: np.ndarray, m: int, k: int) -> np.ndarray:
    """Unbiased MMD² from the off-diagonal kernel sums within and between the two groups."""
    return sxx / (m * (m - 1)) + syy / (k * (k - 1)) - 2.0 * sxy / (m * k)


def permutation_p_value(statistics: np.ndarray) -> tuple[float, float]:
    """`(observed, p)` from `[observed, permuted...]`; ties count against drift."""
    observed = float(statistics[0])
    permuted = statistics[1:]
    tolerance = 1e-7 * max(1.0, abs(observed))
    exceed = int(np.count_nonzero(permuted >= observed - tolerance))
    return observed, (exceed + 1) / (permuted.size + 1)
