"""A 2-D view of both windows: PCA fitted on the reference, both projected on it.

The top axes come from block power iteration on the `[D, D]` scatter matrix and a
Rayleigh-Ritz step on a 4×4 matrix: no full eigendecomposition, which costs far more here
than everything else in the explanation.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pca_2d"]


def _top_axes(centred: np.ndarray, k: int = 2, *, block: int = 4, iterations: int = 60) -> np.ndarray:
    """`[D, k]` orthonormal leading principal axes of the centred rows."""
    d = centred.shape[1]
    b = min(block, d)
    q = np.random.default_rng(0).standard_normal((d, b))
    x = centred.astype(np.float64)
    scatter = x.T @ x  # [D, D]
    for _ in range(iterations):
        q, _ = np.linalg.qr(scatter @ q)
    small = q.T @ scatter @ q  # [b, b]
    values, vectors = np.linalg.eigh(small)
    order = np.argsort(values)[::-1][:k]
    return np.asarray(q @ vectors[:, order])


def pca_2d(reference: np.ndarray, current: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    """`(reference_xy [m, 2], current_xy [k, 2], explained variance ratio of the two axes)`."""
    mean = reference.mean(axis=0)
    centred = reference - mean
    axes = _top_axes(centred, 2)  # [D, 2]
    for j in range(axes.shape[1]):  # a fixed sign: the largest loading positive
        if axes[np.abs(axes[:, j]).argmax(), j] < 0:
            axes[:, j] *= -1
    ref_xy = centred @ axes
    total = float((centred.astype(np.float64) ** 2).sum())
    ratio = [float((ref_xy[:, j] ** 2).sum() / total) if total > 0 else 0.0 for j in range(2)]
    cur_xy = (current - mean) @ axes
    return ref_xy, cur_xy, (ratio[0], ratio[1])
