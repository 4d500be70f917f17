"""A 2-D view of both windows: PCA fitted on the reference, both projected on it."""

from __future__ import annotations

import numpy as np

__all__ = ["pca_2d"]


def pca_2d(reference: np.ndarray, current: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    """`(reference_xy [m, 2], current_xy [k, 2], explained variance ratio of the two axes)`."""
    mean = reference.mean(axis=0)
    centred = reference - mean
    cov = centred.T.astype(np.float64) @ centred  # [D, D]
    var, vecs = np.linalg.eigh(cov)  # ascending
    var = np.maximum(var[::-1], 0.0)
    axes = vecs[:, ::-1][:, :2].copy()  # [D, 2]
    for j in range(axes.shape[1]):  # a fixed sign: the largest loading positive
        if axes[np.abs(axes[:, j]).argmax(), j] < 0:
            axes[:, j] *= -1
    ratio = var[:2] / var.sum() if var.sum() > 0 else np.zeros(2)
    ratio = np.pad(ratio, (0, 2 - ratio.size))
    ref_xy = centred @ axes
    cur_xy = (current - mean) @ axes
    if axes.shape[1] < 2:
        ref_xy = np.pad(ref_xy, ((0, 0), (0, 2 - axes.shape[1])))
        cur_xy = np.pad(cur_xy, ((0, 0), (0, 2 - axes.shape[1])))
    return ref_xy, cur_xy, (float(ratio[0]), float(ratio[1]))
