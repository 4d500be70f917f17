"""The MMD witness function: where the current window has more (or less) mass than the reference.

`w(z) = mean_y k(z, y) - mean_x k(z, x)` with the same averaged kernel as the MMD test;
a point's own term is left out of its window's mean. Positive: typical of the current
window and not of the reference (what appeared); negative: the reverse.
"""

from __future__ import annotations

import numpy as np

from ._kernel import kernel_from_gram

__all__ = ["witness"]


def witness(
    reference: np.ndarray, current: np.ndarray, widths: tuple[float, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """`(w on the reference rows, w on the current rows)`; both windows as given (callers
    subsample large windows first)."""
    m, k = reference.shape[0], current.shape[0]
    k_xx = kernel_from_gram(reference @ reference.T, widths)  # [m, m]
    k_yy = kernel_from_gram(current @ current.T, widths)  # [k, k]
    k_yx = kernel_from_gram(current @ reference.T, widths)  # [k, m]
    own_x = (k_xx.sum(axis=1) - np.diag(k_xx)) / max(m - 1, 1)
    own_y = (k_yy.sum(axis=1) - np.diag(k_yy)) / max(k - 1, 1)
    w_current = own_y - k_yx.mean(axis=1)
    w_reference = k_yx.mean(axis=0) - own_x
    return w_reference.astype(np.float64), w_current.astype(np.float64)
